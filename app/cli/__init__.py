"""The ``keepstep`` command line (typer): one module per command group."""

from .main import app, main

__all__ = ["app", "main"]
