"""Helpers shared by the test suite: project builders, fake providers, servers, crash children."""
