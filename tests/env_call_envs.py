"""Envs for the tests of the calls on the live envs (``Executor.env_method`` / ``get_attr`` /
``set_attr``): importable by worker processes, which unpickle them by reference."""
from __future__ import annotations

import os
import threading

from auturi.envs import CountingEnv


class LevelEnv(CountingEnv):
    """:class:`CountingEnv` whose reward adds its ``level`` (a curriculum's knob, set by
    ``set_level`` or ``set_attr("level", ...)``); it counts its steps and says where it runs."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.level = 0
        self.steps = 0
        self.lock_at = -1  # the step at which it takes a lock: from then on it cannot be pickled

    def set_level(self, level: int) -> int:
        self.level = int(level)
        return self.level

    def step(self, action):
        o, r, te, tr, info = super().step(action)
        self.steps += 1
        if self.steps == self.lock_at:
            self.hold_a_lock()
        return o, r + self.level, te, tr, info

    def pid(self) -> int:
        return os.getpid()

    def fail(self, why: str) -> None:
        raise ValueError(why)

    def hold_a_lock(self) -> None:
        """From now on this env cannot be pickled (a lock is not)."""
        self._lock = threading.Lock()

    def unpicklable_result(self):
        return threading.Lock()


class UnpicklableLevelEnv(LevelEnv):
    """A :class:`LevelEnv` that never pickles (the executor's probe finds it: ``envs_movable``
    False), as an env holding a simulator handle."""

    def __reduce_ex__(self, protocol):
        raise TypeError("UnpicklableLevelEnv cannot be pickled")


class RebuiltLevelEnv(LevelEnv):
    """A :class:`LevelEnv` whose pickle rebuilds it from its constructor's arguments, as
    gymnasium's ``EzPickle`` (MuJoCo) envs do: a copy has the constructor's level."""

    def __reduce__(self):
        return (RebuiltLevelEnv, ())
