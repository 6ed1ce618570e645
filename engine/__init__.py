"""keepstep.engine."""
