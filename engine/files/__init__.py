"""keepstep.engine.files."""
