"""keepstep.engine.core."""
