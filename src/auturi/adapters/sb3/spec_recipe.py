"""The recipe of an env made from a registered gymnasium id (:func:`spec_recipe`, called by
:func:`auturi.adapters.sb3.recover._base_recipe`): ``gym.make(spec)`` in Auturi's workers,
unless that would not make the env the model trains on.

Three ways it would not (the first two found 2026-11-26, /work/notes/sb3-findings.md F2 and
F5; the third 2026-11-27):

- the id names the training script, ``gym.register(id, entry_point="__main__:MyEnv")``:
  Auturi's workers never run the script, so ``gym.make`` there failed with ``module
  '__main__' has no attribute 'MyEnv'`` at the first collect (the serial layout and SB3's
  ``SubprocVecEnv``, whose workers import the script, ran it). :func:`portable_spec` ships the
  creator itself, which cloudpickle copies by value;
- the live env was changed after ``gym.make`` (``venv.env_method("set_level", 3)``,
  ``env.unwrapped.gravity = 5.0``): not in the spec, so lost; a registered curriculum env set
  to level 3 trained at level 0, while the same class passed as an instance (copied by
  pickling) kept level 3. :func:`config_drift` finds such changes, and the live env is then
  copied, as an instance is;
- the constructor reads a setting the script made at run time (a module global set from its
  arguments): Auturi's workers run none of the script, so they made the env with the
  module's import-time value. :func:`made_otherwise` makes one env in a process started
  as the workers are, where the env's module is the user's own, and the live env is copied
  where its settings differ (for a ``SubprocVecEnv`` the live settings come from SB3's
  workers: :mod:`.recover`).

The live env may also have been reset and stepped (a ``learn`` before ``wrap``), which moves
its state attributes. A change is therefore only a scalar attribute of the unwrapped env that
an env freshly made from the same spec holds too, with another value, and that the fresh env
does not move itself over a reset and :data:`PROBE_STEPS` random steps. The fresh env's
profile is made once per process and spec (0.00-0.04 s for classic control and MuJoCo, ~0.3 s
for an ALE game, mostly its make and reset, on the shared 2-core machine, 2026-11-26).

Env workers import this module with :mod:`.recover` (through SB3's ``SubprocVecEnv`` probe): no
torch, no SB3.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.sb3.envs import ENV_FN_HINT, EnvRebuildError

PROBE_STEPS = 64
"""Random steps the fresh env takes to find the attributes that reset and step move."""

_SCRIPT_MODULES = ("__main__", "__mp_main__")
"""Module names that mean the training script: another process's are its own script."""

_SCALARS = (bool, int, float, str, type(None))
_PROFILES: dict[tuple, tuple[dict[str, Any], frozenset] | None] = {}  # spec key -> (initial scalars, moving keys)


def spec_recipe(base: gym.Env, spec: Any, where: str, copy: Callable[[gym.Env, str, str], tuple]) -> tuple:
    """The base recipe of ``base``, a live unwrapped env made from the registered ``spec``:
    ``("make", spec)`` (see :func:`portable_spec`), or, where the live env was changed since
    (:func:`config_drift`), ``copy(base, where, why)`` (``recover._pickled``) when that copy
    keeps the changes; else ``("make", ...)`` with a warning naming them and the fix."""
    changed = config_drift(base, spec)
    why = f"was changed after gym.make({spec.id!r})"
    if not changed:  # then the live env is as made here: what differs is made elsewhere
        changed = made_otherwise(spec, _scalars(base))
        why = (f"is made otherwise by gym.make({spec.id!r}) in a process that ran none of the training script, as "
               f"Auturi's workers run none of it (a setting the script made at run time, read by the env's constructor)")
    if not changed:
        return ("make", portable_spec(spec, where))
    what = ", ".join(f"{k}={live!r} (as made: {made!r})" for k, (live, made) in sorted(changed.items()))
    why = f"{why} ({what})"
    try:
        recipe = copy(base, where, why)
        import cloudpickle

        clone = cloudpickle.loads(recipe[1])
        try:  # a class whose pickle re-runs its constructor (ale_py's AtariEnv, MuJoCo's) drops such changes
            lost = sorted(k for k in changed if not same_value(getattr(clone, k, None), changed[k][0]))
        finally:
            clone.close()
        if not lost:
            return recipe
        problem = f"the env {type(base).__name__} {why}, and a copy of it by pickling does not keep {lost}."
    except EnvRebuildError as exc:
        problem = str(exc)
    warnings.warn(f"{where}: {problem} Auturi's workers make it from its id, without these changes; if they "
                  f"matter, pass them to gym.make (make_vec_env(..., env_kwargs=...)) or use env_fn=",
                  UserWarning, stacklevel=2)
    return ("make", portable_spec(spec, where))


def portable_spec(spec: Any, where: str) -> Any:
    """``spec`` with an entry point that names the training script replaced by the creator it
    names (see the module doc); any other spec as it is."""
    import dataclasses

    entry = getattr(spec, "entry_point", None)
    if not isinstance(entry, str) or entry.partition(":")[0] not in _SCRIPT_MODULES:
        return spec
    from gymnasium.envs.registration import load_env_creator

    try:
        creator = load_env_creator(entry)
    except Exception as exc:  # noqa: BLE001 - named with the fix
        raise EnvRebuildError(f"{where}: its id {spec.id!r} is registered with entry_point={entry!r}, which this "
                              f"process cannot load ({type(exc).__name__}: {exc}); register the class itself "
                              f"(entry_point=MyEnv) or a module path, or {ENV_FN_HINT}") from exc
    return dataclasses.replace(spec, entry_point=creator)


def config_drift(base: gym.Env, spec: Any) -> dict[str, tuple[Any, Any]]:
    """``{attribute: (live value, value as made)}`` for the settings of ``base`` (a live
    unwrapped env made from ``spec``) that differ from an env fresh from ``spec`` (see the
    module doc); empty when none do or the fresh env cannot be profiled."""
    profile = _profile(spec)
    if profile is None:
        return {}
    initial, moving = profile
    live = _scalars(base)
    return {k: (live[k], v) for k, v in initial.items() if k in live and k not in moving and not same_value(live[k], v)}


def made_otherwise(spec: Any, live: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{attribute: (live value, value as made)}`` for the settings of a live env (``live``,
    its scalars, read in another process: an SB3 ``SubprocVecEnv`` worker's) that an env fresh
    from ``spec`` has otherwise in this process or in a process like Auturi's env workers
    (:func:`_made_elsewhere`). Found 2026-11-27: a script that sets ``my_envs.SETTINGS["bonus"]
    = 1.0`` from its arguments, with ``MyEnv-v0``'s constructor reading it, trained on rewards
    2.0 in the serial layout and 1.0 in env workers, with no sign of it. Only for an env module
    of the user's own (an installed
    package's envs hold no script's settings); attributes that reset and steps move do not
    count (one a constructor draws at random does: the live env is then copied, which is what
    SB3 trains on anyway)."""
    if _user_module(spec) is None:
        return {}
    profile = _profile(spec)
    if profile is None:
        return {}
    initial, moving = profile
    other = _made_elsewhere(spec) or {}
    out = {}
    for k, v in live.items():
        if k in moving or k not in initial:
            continue
        for made in (initial[k], other.get(k, v)):
            if not same_value(v, made):
                out[k] = (v, made)
                break
    return out


_ELSEWHERE: dict[tuple, dict[str, Any] | None] = {}  # spec key -> scalars made in a fresh env worker


def _made_elsewhere(spec: Any) -> dict[str, Any] | None:
    """The scalars of an env fresh from ``spec`` made in a process started as Auturi's env
    workers are (from the env workers' server, none of the training script run), or None:
    the entry point is not a module of the user's (an installed package's envs hold no
    script's settings: no process is started for them), this process cannot start one (an
    SB3 ``SubprocVecEnv`` worker is daemonic), or the env could not be made there in time."""
    import multiprocessing as mp

    module = _user_module(spec)
    if module is None or mp.current_process().daemon or "forkserver" not in mp.get_all_start_methods():
        return None
    key = _spec_key(spec)
    if key is None:
        return None
    if key in _ELSEWHERE:
        return _ELSEWHERE[key]
    from auturi.executor.base import resolve_worker_timeout
    from auturi.executor.shm.forkservers import EnvProcess
    from auturi.executor.shm.processes import start_without_main

    out, proc, mine = None, None, None
    try:
        mine, theirs = mp.get_context("forkserver").Pipe(duplex=False)
        proc = EnvProcess(target=_send_fresh_scalars, args=(spec, theirs), daemon=True)
        proc.preload = (module,)  # type: ignore[attr-defined]
        start_without_main(proc)
        theirs.close()
        if mine.poll(min(60.0, resolve_worker_timeout(None))):
            out = mine.recv()
    except Exception:  # noqa: BLE001 - a check, never a reason to fail a wrap
        out = None
    finally:
        if mine is not None:
            mine.close()
        if proc is not None:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    _ELSEWHERE[key] = out if isinstance(out, dict) else None
    return _ELSEWHERE[key]


def _send_fresh_scalars(spec: Any, conn: Any) -> None:
    """In the started process: the scalars of an env fresh from ``spec`` (None if it fails)."""
    env = None
    try:
        env = gym.make(spec)
        conn.send(_scalars(env.unwrapped))
    except Exception:  # noqa: BLE001
        conn.send(None)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
        conn.close()


def _spec_key(spec: Any) -> tuple | None:
    """What the caches of :func:`_profile` and :func:`_made_elsewhere` key a spec by (None:
    a spec that cannot say)."""
    try:
        return spec.id, repr(sorted(spec.kwargs.items())), repr(spec.entry_point)
    except Exception:  # noqa: BLE001
        return None


def _user_module(spec: Any) -> str | None:
    """The module of ``spec``'s entry point when it is the user's own (a file outside the
    installed packages and the standard library), else None (also for the training script,
    whose creator travels by value: :func:`portable_spec`)."""
    import importlib.util
    import os
    import sysconfig

    entry = getattr(spec, "entry_point", None)
    name = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
    if not name or name in _SCRIPT_MODULES:
        return None
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None
    path = os.path.realpath(origin)
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    roots = [os.path.realpath(p) + os.sep for p in installed if p]
    return None if any(path.startswith(r) for r in roots) else name


def same_value(a: Any, b: Any) -> bool:
    """Equal scalars (NaN equal to NaN)."""
    if a is b:
        return True
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=isinstance(a, (float, np.floating))))
    except Exception:  # noqa: BLE001 - values that do not compare are different
        return False


def _scalars(env: Any) -> dict[str, Any]:
    out = {}
    for key, value in vars(env).items():
        if isinstance(value, _SCALARS) or (isinstance(value, np.generic) and np.ndim(value) == 0):
            out[key] = value
    return out


def _profile(spec: Any) -> tuple[dict[str, Any], frozenset] | None:
    """The scalars of an env fresh from ``spec`` and those its reset and steps move; ``None``
    when the fresh env cannot be made or stepped (then nothing is reported: this is a check,
    never a reason to fail a wrap)."""
    key = _spec_key(spec)
    if key is None:
        return None
    if key in _PROFILES:
        return _PROFILES[key]
    from auturi.errors import WorkerError
    from auturi.executor.base import resolve_worker_timeout
    from auturi.executor.local_lanes import CallerWatchdog

    made: list[Any] = []
    calls = [0]
    # An env that never returns from a step hung the wrap here with no word (2026-11-27): the
    # probe is watched as the caller's own collects are, and such an env is a WorkerError.
    dog = CallerWatchdog(resolve_worker_timeout(None), lambda: calls[0],
                         f"the wrap's check of an env fresh from gym.make({spec.id!r})")
    try:
        profile = dog.run(_probe, spec, made, calls)
    except WorkerError:
        raise
    except Exception:  # noqa: BLE001 - see the docstring
        profile = None
    finally:
        dog.close()
        for env in made:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
    _PROFILES[key] = profile
    return profile


def _probe(spec: Any, made: list, calls: list) -> tuple[dict[str, Any], frozenset]:
    """:func:`_profile`'s steps (``made`` gets the env, ``calls`` counts its calls)."""
    env = gym.make(spec)
    made.append(env)
    base = env.unwrapped
    initial = _scalars(base)
    moving: set[str] = set()

    def note() -> None:
        calls[0] += 1
        moving.update(k for k, v in _scalars(base).items() if k not in initial or not same_value(v, initial[k]))

    env.action_space.seed(0)
    env.reset(seed=0)
    note()
    for _ in range(PROBE_STEPS):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        note()
        if terminated or truncated:
            env.reset()
            note()
    return initial, frozenset(moving)
