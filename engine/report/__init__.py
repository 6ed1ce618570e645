"""keepstep.engine.report."""
