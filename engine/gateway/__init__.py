"""keepstep.engine.gateway."""
