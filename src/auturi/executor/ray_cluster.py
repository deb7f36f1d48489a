"""Moved to :mod:`auturi.executor.ray.cluster` (the ``ray`` backend is a package since
2026-11-26). Kept only because ``auturi/cli/app.py`` still imports ``place_lines`` from here;
remove it once that import reads ``from auturi.executor.ray.cluster import place_lines``."""
from auturi.executor.ray.cluster import place_lines

__all__ = ["place_lines"]
