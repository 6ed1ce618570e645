"""Drills and the reference story of the sample pack: real processes killed at
commit-protocol boundaries, and the bare worker process
(``python -m keepstep.engine.drills.worker``) they start."""
