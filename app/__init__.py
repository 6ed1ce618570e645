"""keepstep.app."""
