"""Moved to :mod:`auturi.envs.envpool`; this name stays for old imports."""
from auturi.envs.envpool import *  # noqa: F401,F403
