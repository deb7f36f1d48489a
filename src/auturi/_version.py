"""Auturi's version, in a module of its own: the package root, the tuner's results records and
the status server read it from here without importing the package root (which imports them),
and pyproject.toml reads it for the distribution's version."""
__version__ = "0.1.0"
