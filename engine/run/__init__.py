"""keepstep.engine.run."""
