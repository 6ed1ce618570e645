"""Drills and the ME-042 story: real processes killed at commit-protocol boundaries, and the
bare worker process (``python -m keepstep.engine.drills.worker``) they start."""
