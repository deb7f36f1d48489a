"""What every env-source module shares: the EnvPool and ALE vector env id prefixes, the seed of
env ``i``, and how warnings raised while making envs are shown once per process tree.

Below :mod:`auturi.envs`, :mod:`auturi.envs.envpool` and :mod:`auturi.envs.ale_vector`, which
all read it, so none imports another back. This module must not import torch: env workers import it.

Warnings, once per process tree (the owner, the process that made the executor, and every
worker it started): an executor makes the same env in its owner (the probe, the envs a
layout steps there) and in every worker. Without care, ``auturi tune HalfCheetah-v5`` printed
MuJoCo's ``settotalmass`` notice 34 times and ``auturi.wrap`` 20 (2026-11-26). Three parts:

- MuJoCo's own warnings are printed by its C library (to stderr, and appended to a
  ``MUJOCO_LOG.TXT`` in the working directory of every process), past Python's ``warnings``.
  Where Auturi makes an env, MuJoCo's warning callback is set (unless the user set one) to
  :func:`mujoco_warning`, a Python warning of category :class:`MuJoCoWarning`: shown once per
  text and place in a process, filtered like any other warning, and no log file. It stays set
  (in the caller too, from its first env made through Auturi on); a worker sets it when its
  env factories arrive, so also for envs moved to it (unpickling a MuJoCo env compiles its
  model again), where the worker unpickles the factories first.
- The owner shows each distinct warning raised while making envs once and notes it
  (:func:`noting_shown_warnings`; MuJoCo's are noted even where its filters hide them); the
  env factories carry that list to the workers when they are pickled
  (:class:`auturi.envs.ProcessTreeEnvFn`), and each worker ignores those
  (:func:`ignore_owner_warnings`): the owner has made the env, so it has shown them.
- What the owner did not show (a warning only workers raise) each worker forkserver shows
  once across the workers it forks (:mod:`auturi.executor.shm.preload`).
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import re
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Sequence

import numpy as np

ENVPOOL_PREFIX = "envpool:"
ALE_PREFIX = "ale:"
"""``"ale:pong"`` / ``"ale:Pong-v5"``: the game stepped by ale-py's ``AtariVectorEnv``
(:mod:`auturi.envs.ale_vector`). No module is named ``ale`` (ale-py's is ``ale_py``), so the
prefix cannot be gymnasium's ``module:Env-v0`` spelling."""


def env_seed(seed: int, env_index: int, generation: int) -> int:
    """Seed of env ``env_index``: ``seed + i`` the first time it is made; a fresh, distinct
    seed each time it is recreated (after a reconfigure moves it) so episodes do not repeat."""
    if generation == 0:
        return seed + env_index
    return int(np.random.SeedSequence([seed, env_index, generation]).generate_state(1)[0])


# ------------------------------------------------------------------------ warnings
class MuJoCoWarning(UserWarning):
    """A warning of MuJoCo's C library (its compiler's deprecation notices, a simulation
    going unstable), routed into Python's ``warnings`` where Auturi makes envs; silence it
    with ``warnings.filterwarnings("ignore", category=auturi.envs.MuJoCoWarning)``."""


_NOTED: dict[tuple[type, str], None] = {}
"""(category, text) of the warnings this process showed, or chose by its filters not to show
(MuJoCo's), while making envs: its workers do not show them (an ordered set)."""
_SHOWN: set[tuple[type, str]] = set()
"""What :func:`noting_shown_warnings` showed in this process: not shown again."""
_MAX_NOTED = 64  # a bound on what travels with every env factory; past it, workers show their own
_IGNORED: set[tuple[type, str]] = set()  # the owner's warnings this (worker) process already ignores


def note_shown(category: type, text: str) -> None:
    """Record that this process showed (or, by its filters, chose not to show) a warning."""
    if len(_NOTED) < _MAX_NOTED:
        _NOTED[(category, str(text))] = None


def shown_warnings() -> tuple[tuple[type, str], ...]:
    """What this process noted, for the workers: categories a worker can import by name
    (a category defined in ``__main__`` would arrive there as another class, which no filter
    of it matches)."""
    return tuple(k for k in _NOTED if k[0].__module__ != "__main__")


def ignore_owner_warnings(shown: Iterable[tuple[type, str]]) -> None:
    """In a worker: never show the warnings the owner has shown (each an ``ignore`` filter on
    its category and exact text). Idempotent."""
    for category, text in shown:
        if (category, text) in _IGNORED:
            continue
        _IGNORED.add((category, text))
        warnings.filterwarnings("ignore", message=re.escape(text) + r"\Z", category=category)


_observing = {"depth": 0, "show": None}  # noting_shown_warnings' observer: installed by the first of
_observing_lock = threading.Lock()        # overlapping makes (threads), restored by the last


def _observe(message: Any, category: type, filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
    key = (category, str(message))
    if key in _SHOWN:
        return
    _SHOWN.add(key)
    note_shown(*key)
    _observing["show"](message, category, filename, lineno, file, line)


@contextlib.contextmanager
def noting_shown_warnings() -> Iterator[None]:
    """In the owner, around the making of an env: show each distinct warning once (category
    and text) and note it (:func:`note_shown`), so the workers do not show it again. Once,
    not by Python's rule of once per place: a class from the caller's script that
    cloudpickle copied (the executor pickles the factories for its workers) has new globals,
    so a warning its ``__init__`` raises counted as new at each copy."""
    with _observing_lock:
        if _observing["depth"] == 0:
            _observing["show"] = warnings.showwarning
            warnings.showwarning = _observe
        _observing["depth"] += 1
    try:
        yield
    finally:
        with _observing_lock:
            _observing["depth"] -= 1
            if _observing["depth"] == 0 and warnings.showwarning is _observe:  # unless replaced meanwhile
                warnings.showwarning = _observing["show"]


def mujoco_warning(message: str) -> None:
    """MuJoCo's warning callback (``mujoco.set_mju_user_warning``): a :class:`MuJoCoWarning`,
    noted for the workers whether this process's filters show it or not. Never raises: it
    runs inside MuJoCo's C code, which an exception must not cross (with warnings made
    errors, ``-W error``, the text goes to stderr as MuJoCo's own would)."""
    text = str(message)
    note_shown(MuJoCoWarning, text)
    try:
        warnings.warn(text, MuJoCoWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - see the docstring
        sys.stderr.write(f"WARNING: {text}\n")


_routed = False


def route_mujoco_warnings() -> bool:
    """Set MuJoCo's warning callback to :func:`mujoco_warning` where ``mujoco`` is imported
    and its callback is unset (a user's own is left alone). Whether it is imported."""
    global _routed
    mj = sys.modules.get("mujoco")
    if mj is None or not hasattr(mj, "set_mju_user_warning"):
        return False
    if not _routed:
        _routed = True
        if mj.get_mju_user_warning() is None:
            mj.set_mju_user_warning(mujoco_warning)
    return True


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Sets MuJoCo's warning callback the moment ``mujoco`` is imported: the env factory
    that imports it compiles its model, and warns, right after. Importing MuJoCo beforehand
    instead would cost every worker 0.2 s whether its env uses MuJoCo or not."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "mujoco":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # one shot; and find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            route_mujoco_warnings()

        loader.exec_module = exec_module
        return spec


def route_mujoco_warnings_on_import() -> None:
    """In a worker: MuJoCo's warnings become :class:`MuJoCoWarning` from now on, whenever
    MuJoCo is imported (the hook stays until it is). Idempotent."""
    if not route_mujoco_warnings() and not any(isinstance(f, _RouteOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RouteOnImport())


@contextlib.contextmanager
def routing_mujoco_warnings() -> Iterator[None]:
    """Around the making of an env: MuJoCo's warnings become :class:`MuJoCoWarning`, whether
    MuJoCo is imported already or the env imports it."""
    hook = None
    if not route_mujoco_warnings():
        hook = _RouteOnImport()
        sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        if hook is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(hook)


def one_source(source: Any, env_ids: Sequence[int], cls: type, runner: str) -> Any:
    """``source`` itself (a ``cls``, or a task id ``cls`` takes), or -- so a vector-env runner
    (EnvPool's, ale-py's) also takes EnvRunner's ``env_fns`` -- the one ``cls`` that a list of
    per-env factories holds for ``env_ids``. ``runner`` names the runner in the error."""
    if isinstance(source, str):
        return cls(source)
    if isinstance(source, cls):
        return source
    if isinstance(source, Sequence):
        picked = [source[i] for i in env_ids]
        if all(isinstance(s, cls) for s in picked) and all(s == picked[0] for s in picked):
            return picked[0]
    raise TypeError(f"{runner} needs an {cls.__name__} (or one per env, all equal), got {source!r}")


def runner_slots(table: Any, ids: Any, env_ids: Sequence[int]) -> Any:
    """``table[ids]``: where a vector-env runner keeps each of ``ids`` (``table`` maps an env
    id to its slot, -1 where the runner has none). Raises KeyError for an id not the runner's
    (``env_ids``), ValueError for an id twice (one env stepped twice in one send)."""
    try:
        slots = table[ids]
    except IndexError:
        slots = np.array([-1])
    if ids.min() < 0 or slots.min() < 0:
        raise KeyError(f"env ids {sorted(set(ids.tolist()) - set(env_ids))} are not this runner's")
    if len(ids) > 1 and len(np.unique(slots)) != len(ids):
        raise ValueError(f"step() got an env id twice: {ids.tolist()}")
    return slots
