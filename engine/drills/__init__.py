"""keepstep.engine.drills."""
