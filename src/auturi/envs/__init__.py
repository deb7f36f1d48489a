"""Where envs come from: the env sources an executor takes.

An executor takes ``env`` as a gymnasium id (``"CartPole-v1"``), an EnvPool id
(``"envpool:Pong-v5"``), an ALE game stepped by ale-py's ``AtariVectorEnv`` (``"ale:pong"`` or
``"ale:Pong-v5"``), one ``Callable[[], gymnasium.Env]`` used for every env, or a list of them,
one per env. :func:`resolve_env_fns` turns each into one factory per env (for the two prefixes,
a source whose ``make_runner`` the executor uses); factories travel to worker processes with
cloudpickle, so lambdas work.

Ids that a module registers when imported work in the caller and in every worker: gymnasium's
``"module:Env-v0"`` spelling (the module is imported here and again in each worker before
``gym.make``), ids of known providers (``"ALE/Pong-v5"`` imports ``ale_py``, see
:data:`ID_PROVIDERS`), and any id registered in the caller (the factory carries the id's
``EnvSpec``, so a worker that lacks the registration makes the env from it).

Every factory :func:`resolve_env_fns` returns is a :class:`ProcessTreeEnvFn`: in a worker it
first imports the id providers the caller had imported (so a user's ``lambda:
gym.make("ALE/Pong-v5")`` works there too; gymnasium 1.x loads no plugins by itself), and
says what to do when the env's id is unknown there; in every process it shows a warning
raised while making the env once per process tree (:mod:`auturi.envs.base`).

The package's modules, by role: :mod:`auturi.envs.base` (the id prefixes and :func:`env_seed`,
which every source shares), :mod:`auturi.envs.envpool` (EnvPool's source and runner),
:mod:`auturi.envs.ale_vector` (ale-py's ``AtariVectorEnv`` source and runner) and
:mod:`auturi.envs.testing` (the test envs, re-exported here as before:
``from auturi.envs import CountingEnv``).

This package must not import torch: env workers import it.
"""
from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import sys
from typing import Any, Callable, Sequence, Union

import gymnasium as gym

from auturi.envs.ale_vector import AleVectorSource
from auturi.envs.base import (
    ALE_PREFIX,
    ENVPOOL_PREFIX,
    MuJoCoWarning,
    env_seed,
    ignore_owner_warnings,
    noting_shown_warnings,
    route_mujoco_warnings_on_import,
    routing_mujoco_warnings,
    shown_warnings,
)
from auturi.envs.envpool import EnvPoolSource
from auturi.envs.testing import (
    ACTION_SPACES,
    ActionDtypeEnv,
    CountingEnv,
    FaultyEnv,
    HeavyTailEnv,
    LargeObsEnv,
    SlowEnv,
)

__all__ = [
    "ALE_PREFIX", "AleVectorSource", "EnvFn", "EnvLike", "ENVPOOL_PREFIX", "EnvPoolSource", "ID_PROVIDERS",
    "MuJoCoWarning", "ProcessTreeEnvFn", "env_seed", "find_env_id", "is_ale_vector", "is_envpool", "resolve_env_fns",
    "ACTION_SPACES", "ActionDtypeEnv", "CountingEnv", "FaultyEnv", "HeavyTailEnv", "LargeObsEnv", "SlowEnv",
]

EnvFn = Callable[[], gym.Env]
EnvLike = Union[str, EnvFn, Sequence[EnvFn]]

ID_PROVIDERS: dict[str, str] = {"ALE": "ale_py"}
"""Id namespace -> the module whose import registers its ids (gymnasium 1.x no longer loads
plugins by itself)."""
PROVIDER_MODULES = ("ale_py", "gymnasium_robotics")
"""Modules tried, when installed, for an unknown id without a known namespace (gymnasium-
robotics registers ``FetchReach-v4``, ``AntMaze_UMaze-v5``, ... on import)."""


WORKER_ID_HINT = ("This env factory ran in an Auturi worker process, which has imported only what the factory "
                  "imports (and the id providers {providers} where the caller had): import the module that registers "
                  "the id inside the factory (ALE ids: import ale_py; gym.register_envs(ale_py)), or give Auturi "
                  "the id itself as 'module:Env-v0'")


class ProcessTreeEnvFn:
    """An env factory that makes the same env in every process of an executor's tree: the
    owner (the process that made the executor, where this object was made) and the workers
    it starts (where it arrives pickled). In a worker, before the first env: the id
    providers the owner had imported are imported (their ids are registered as in the
    owner), and the warnings the owner showed while making envs are ignored; an unknown id
    says what to do. In every process MuJoCo's C warnings become Python warnings
    (:mod:`auturi.envs.base`).

    Subclasses make the env in :meth:`make`; this class calls ``fn``."""

    def __init__(self, fn: EnvFn | None = None):
        self.fn = fn
        self._owner = True
        self._providers: tuple[str, ...] = ()
        self._owner_shown: tuple[tuple[type, str], ...] = ()

    def make(self) -> gym.Env:
        assert self.fn is not None
        return self.fn()

    def __call__(self) -> gym.Env:
        if self._owner:
            with routing_mujoco_warnings(), noting_shown_warnings():
                return self.make()
        self._enter_worker()
        with routing_mujoco_warnings():
            try:
                return self.make()
            except gym.error.UnregisteredEnv as e:
                providers = "(" + ", ".join(self._providers) + ")" if self._providers else "(none)"
                raise type(e)(f"{e} {WORKER_ID_HINT.format(providers=providers)}") from e

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """The modules a worker imports to make its env that this object's pickle does not
        name: the id providers it imports on arrival (:meth:`_enter_worker`) and what ``fn``
        declares (its own ``preload_modules``). Its forkserver imports them once for every
        worker it forks (:func:`auturi.executor.shm.forkservers.modules_to_preload`)."""
        return tuple(dict.fromkeys((*self._providers, *_imported_providers(),
                                    *getattr(self.fn, "preload_modules", ()))))

    def for_timing(self) -> ProcessTreeEnvFn:
        """The factory to time an env with (:func:`auturi.tuner.timing.time_env`): ``fn``'s own
        ``for_timing()`` where it has one (a recipe whose envs write nothing to the user's
        files, as the SB3 face's), else this factory."""
        inner = getattr(self.fn, "for_timing", None)
        if not callable(inner):
            return self
        quiet = object.__new__(type(self))  # not copy.copy: that goes through the pickle state, a worker's
        vars(quiet).update(vars(self))
        quiet.fn = inner()
        return quiet

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        del state["_owner"]
        # What this process knows, added to what it inherited (a Ray actor passes both on to its own workers).
        state["_providers"] = tuple(dict.fromkeys((*self._providers, *_imported_providers())))
        state["_owner_shown"] = tuple(dict.fromkeys((*self._owner_shown, *shown_warnings())))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._owner = False
        if multiprocessing.parent_process() is not None:
            # Arrived in a worker (not a pickle round trip in the owner, whose warnings and
            # imports are its own): set up now, before envs moved here are unpickled, which
            # makes them (a MuJoCo env compiles its model again) without calling a factory.
            self._enter_worker()
            route_mujoco_warnings_on_import()

    def _enter_worker(self) -> None:
        """Import the owner's id providers; ignore the warnings it showed. Idempotent."""
        for module in self._providers:
            try:
                importlib.import_module(module)
            except ImportError:  # not installed where this worker runs: an id it registers says so on make
                pass
        ignore_owner_warnings(self._owner_shown)

    def __repr__(self) -> str:
        return repr(self.fn)


class _MakeById(ProcessTreeEnvFn):
    """A picklable ``gym.make(env_id, **kwargs)`` that works where the id is not registered:
    it imports ``module`` first (the module that registers the id), and makes the env from
    the caller's ``EnvSpec`` if the id is still unknown in this process."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], module: str | None = None):
        super().__init__()
        self.env_id, self.kwargs, self.module = env_id, kwargs, module
        self.spec = gym.spec(env_id) if env_id in gym.registry else None

    @property
    def preload_modules(self) -> tuple[str, ...]:
        spec = self.spec if self.spec is not None else gym.registry.get(self.env_id)
        own = ((self.module,) if self.module else ()) + (entry_point_modules(spec) if spec is not None else ())
        return tuple(dict.fromkeys((*super().preload_modules, *own)))

    def make(self) -> gym.Env:
        if self.module is not None:
            importlib.import_module(self.module)
        if self.env_id not in gym.registry and self.spec is not None:
            return gym.make(self.spec, **self.kwargs)
        return gym.make(self.env_id, **self.kwargs)

    def __repr__(self) -> str:
        return f"gym.make({self.env_id!r})"


def _imported_providers() -> tuple[str, ...]:
    """The id providers this process has imported (a worker imports them too)."""
    return tuple(m for m in (*ID_PROVIDERS.values(), *PROVIDER_MODULES) if m in sys.modules)


def entry_point_modules(spec: Any) -> tuple[str, ...]:
    """The modules ``gym.make(spec)`` imports by name: its env's entry point and those of its
    additional wrappers (``"module:Class"`` strings; a callable entry point pickles by itself).

    >>> entry_point_modules(gym.spec("CartPole-v1"))
    ('gymnasium.envs.classic_control.cartpole',)
    """
    points = [getattr(spec, "entry_point", None)]
    points += [getattr(w, "entry_point", None) for w in (getattr(spec, "additional_wrappers", None) or ())]
    return tuple(dict.fromkeys(p.split(":", 1)[0] for p in points if isinstance(p, str) and ":" in p))


def _import_registering(module: str, env: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"env {env!r}: cannot import module {module!r} ({e}); install it or check that it is on "
                         f"PYTHONPATH") from e


def find_env_id(env: str) -> tuple[str, str | None]:
    """``(id, module)`` for a gymnasium id string: ``module`` is the module whose import
    registers the id (None for ids gymnasium itself registers). ``"pkg:Env-v0"`` imports
    ``pkg``; an unknown id imports its namespace's provider (``ALE/...``: ``ale_py``) or the
    installed :data:`PROVIDER_MODULES`. Raises ``ValueError`` naming the fix.

    >>> find_env_id("CartPole-v1")
    ('CartPole-v1', None)
    >>> find_env_id("auturi.envs.testing:auturi/Counting-v0")
    ('auturi/Counting-v0', 'auturi.envs.testing')
    """
    module, sep, env_id = env.rpartition(":")
    if sep:
        if not module or not env_id:
            raise ValueError(f"env {env!r}: write module:Env-v0 (gymnasium's spelling) or an id")
        _import_registering(module, env)
    if env_id not in gym.registry:
        namespace = env_id.split("/")[0] if "/" in env_id else None
        candidates = [ID_PROVIDERS[namespace]] if namespace in ID_PROVIDERS else \
            [m for m in PROVIDER_MODULES if namespace is None and importlib.util.find_spec(m) is not None]
        for candidate in candidates:
            if importlib.util.find_spec(candidate) is None:
                extra = " (pip install 'auturi[atari]')" if candidate == "ale_py" else ""
                raise ValueError(f"env {env_id!r} needs {candidate}, which is not installed: pip install "
                                 f"{candidate.replace('_', '-')}{extra}")
            _import_registering(candidate, env)
            if env_id in gym.registry:
                module = candidate
                break
    if env_id not in gym.registry:
        close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())][:5]
        hint = f" Similar ids: {close}." if close else ""
        raise ValueError(f"unknown gymnasium env id {env_id!r}.{hint} Register it, import the module "
                         f"that registers it (or write module:{env_id}), or pass a factory: env=lambda: MyEnv().")
    return env_id, module or None


def is_envpool(env: EnvLike) -> bool:
    return isinstance(env, str) and env.startswith(ENVPOOL_PREFIX)


def is_ale_vector(env: EnvLike) -> bool:
    """Whether ``env`` is an ``"ale:GAME"`` id (ale-py's ``AtariVectorEnv``)."""
    return isinstance(env, str) and env.startswith(ALE_PREFIX)


def resolve_env_fns(env: EnvLike, num_envs: int | None, **make_kwargs: Any) -> list[EnvFn]:
    """One factory per env. ``num_envs`` may be None only when ``env`` is a list."""
    if isinstance(env, str):
        if is_envpool(env):
            return [EnvPoolSource(env[len(ENVPOOL_PREFIX):], **make_kwargs)] * _need(num_envs)
        if is_ale_vector(env):
            return [AleVectorSource(env[len(ALE_PREFIX):], **make_kwargs)] * _need(num_envs)
        env_id, module = find_env_id(env)
        fns: list[EnvFn] = [_MakeById(env_id, make_kwargs, module)] * _need(num_envs)
    elif callable(env):
        fns = [_in_tree(env)] * _need(num_envs)
    elif isinstance(env, Sequence) and env and all(callable(f) for f in env):
        wrapped = {id(f): _in_tree(f) for f in env}  # one wrapper per distinct factory: each pickles once
        fns = [wrapped[id(f)] for f in env]
        if num_envs is not None and num_envs != len(fns):
            raise ValueError(f"num_envs={num_envs} but {len(fns)} env factories were given; pass one per env")
    else:
        raise TypeError(f"env must be a gymnasium id, an EnvPool id ('envpool:Pong-v5'), an ALE vector env id "
                        f"('ale:pong'), a factory returning a gymnasium.Env, or a list of them; got {env!r}")
    return fns


def _in_tree(fn: EnvFn) -> EnvFn:
    """``fn`` as a :class:`ProcessTreeEnvFn`; a source with its own runner (EnvPool's and the
    ALE vector env's, whose ``make_runner`` the executor looks for) and one already wrapped are left as they are."""
    if isinstance(fn, ProcessTreeEnvFn) or hasattr(fn, "make_runner"):
        return fn
    return ProcessTreeEnvFn(fn)


def _need(num_envs: int | None) -> int:
    if num_envs is None or num_envs < 1:
        raise ValueError("num_envs (>= 1) is required when env is an id or a single factory: pass num_envs=N, "
                         "a config (its num_envs), or a list of one factory per env")
    return num_envs
