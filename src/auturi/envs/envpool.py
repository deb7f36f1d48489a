"""EnvPool (https://github.com/sail-sg/envpool) behind auturi's env-runner interface.

:class:`EnvPoolSource` names an EnvPool task (``"CartPole-v1"``, ``"Pong-v5"`` or the
executor's ``"envpool:Pong-v5"`` spelling) plus its make kwargs. It is small and picklable,
gives the gymnasium ``observation_space`` / ``action_space`` from EnvPool's spec without
building a pool, and calling it returns :class:`EnvPoolEnv`, a one-env ``gymnasium.Env``
(the executor's probe, and a per-env factory for :class:`~auturi.executor.env_runner.EnvRunner`).

One module on purpose (over 400 lines): the source, the one-env view and the runner share
EnvPool's seeding and spec handling, and together are the whole EnvPool integration.

:class:`EnvPoolRunner` is a drop-in for ``EnvRunner``: same constructor
``(env_ids, source, seed, generation)``, same attributes and methods, same data, but its envs
live in ONE EnvPool (``env_type="gymnasium"``) stepped by EnvPool's C++ thread pool.

How EnvPool is driven (read from envpool 1.2.x ``core/async_envpool.h``, ``core/env.h``,
``core/state_buffer_queue.h`` and ``python/envpool.py``):

* The pool is made in *sync* mode (``batch_size == num_envs``). ``send(actions, env_id)`` with
  any subset of env ids is supported there: the C++ side counts the envs in flight and
  ``recv()`` waits for exactly those, returning them in the order they were sent (the sync
  ``order`` slot), then moves on to a fresh state buffer. So ``step(ts, ids)`` is one
  ``send`` of exactly the envs asked for plus one ``recv``; envs not named are not touched,
  and what env i sees never depends on which envs were stepped with it (each env is its own
  C++ object with its own RNG). Async mode (``batch_size < num_envs``) would return
  whichever envs finish first, which does not fit "step exactly these envs".
* EnvPool auto-resets *on the next step*: a step sent to an env that is done runs
  ``Reset()`` instead of ``Step`` and ignores the action. To give SB3 semantics, when envs end
  in a step we at once send one more step for just those envs (with a dummy action) and
  write the observation it returns -- the reset observation -- into ``obs[t+1]``; the real
  last observation and info go to ``finals``. We use this auto-reset step rather than a
  forced ``reset(env_id)`` on purpose: it is exactly the reset EnvPool itself would do, so
  env options that distinguish the two keep EnvPool's meaning (Atari ``episodic_life=True``
  continues the game after a life loss but a forced reset restarts it; ViZDoom checks the
  same flag).
* For speed the round trip calls the C++ ``_send``/``_recv`` under EnvPool's Python
  ``send``/``recv`` when the task has the plain single-player layout (see :class:`_PoolIO`);
  otherwise, and as the reference, the public API.
* Actions reach EnvPool as one batch: the rows of the rollout's action array (the policy's
  dtype, what SB3 would hand a VecEnv) cast to the task's action dtype exactly as EnvPool's own
  ``send`` casts them (``astype``; the direct path's ``np.ascontiguousarray(a, dtype)`` is the
  same cast). :class:`EnvPoolEnv` takes one env's action as DummyVecEnv hands it (a numpy
  scalar or array) and casts it the same way.
* Seeding: each C++ env seeds itself ``env_seed[j]`` when the pool is made with a per-env
  seed list (``env_seed=[...]``; otherwise ``seed + j`` for pool index j). We pass the list
  ``[env_seed(seed, i, generation) for i in env_ids]``, so env i gets the same seed as
  ``EnvRunner`` would give it, whatever the layout (any subset, any generation). EnvPool seeds
  are C++ ``int``: a seed outside int32 is passed as the int32 with the same low 32 bits,
  which seeds ``std::mt19937`` (the envs' RNG, which keeps the seed mod 2**32) identically.
  EnvPool seeds are fixed when the pool is made, so a second ``reset_all`` rebuilds the pool
  to start again from the seeds, as ``EnvRunner.reset_all`` reseeds.

EnvPool's envs are not gymnasium's: ``envpool:CartPole-v1`` and gymnasium's ``CartPole-v1``
give different numbers for the same seed (different RNG), and EnvPool marks an episode that
ends at ``max_episode_steps`` as truncated even if it also terminated there.

This module must not import torch (env workers import it); it imports envpool lazily.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from auturi.envs.base import ENVPOOL_PREFIX, env_seed, one_source, runner_slots

# make kwargs the adapter sets itself
_RESERVED = frozenset({"num_envs", "batch_size", "seed", "env_seed", "env_type", "gym_reset_return_info",
                       "max_num_players"})


def _envpool():
    try:
        import envpool
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError("EnvPool envs need the envpool package: pip install envpool") from e
    return envpool


def to_int32_seed(seed: int) -> int:
    """The int32 with the same low 32 bits as ``seed``: what EnvPool's C++ ``int`` seed
    holds, and the same ``std::mt19937`` state as seeding with ``seed mod 2**32``."""
    s = int(seed) & 0xFFFFFFFF
    return s - (1 << 32) if s >= (1 << 31) else s


def _available_cores() -> int:
    """This process's cores, capped by its cgroup's CPU quota (:func:`auturi.resources.usable_cores`)."""
    from auturi.resources import usable_cores

    return usable_cores()


def unbatch_info(info: dict[str, Any], k: int) -> dict[str, Any]:
    """Env ``k``'s entries of a batched EnvPool info dict: numpy scalars become Python
    scalars, arrays are copied. ``players`` (the multi-player bookkeeping, a copy of
    ``env_id`` for single-player tasks) is left out."""
    out: dict[str, Any] = {}
    for key, v in info.items():
        if isinstance(v, dict):
            if key != "players":
                out[key] = unbatch_info(v, k)
            continue
        x = np.asarray(v)[k]
        out[key] = x.item() if np.ndim(x) == 0 else np.array(x)
    return out


class EnvPoolSource:
    """An EnvPool task and its make kwargs, e.g. ``EnvPoolSource("Pong-v5", episodic_life=True)``.

    ``num_envs``, ``batch_size``, ``seed`` and ``env_seed`` are set by whoever builds the pool
    and may not be given here; ``num_threads`` may (the default thread count of runners).
    Picklable (the cached spec is dropped). Calling it returns a one-env :class:`EnvPoolEnv`.
    """

    def __init__(self, task_id: str, **make_kwargs: Any):
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a string such as 'CartPole-v1', got {task_id!r}")
        if task_id.startswith(ENVPOOL_PREFIX):
            task_id = task_id[len(ENVPOOL_PREFIX):]
        bad = sorted(_RESERVED & make_kwargs.keys())
        if bad:
            raise ValueError(f"EnvPoolSource sets {bad} itself (per runner); leave them out of the make kwargs")
        self.task_id = task_id
        self.make_kwargs = dict(make_kwargs)
        self._spec: Any = None
        self._spaces: tuple[gym.Space, gym.Space] | None = None
        specs = _envpool().registration.registry.specs
        if task_id not in specs:
            stem = task_id.split("-")[0].lower()
            close = [k for k in specs if k.lower().startswith(stem)][:5]
            hint = f" Similar ids: {close}." if close else ""
            raise ValueError(f"unknown EnvPool task id {task_id!r}.{hint}")

    # ------------------------------------------------------------------ description
    @property
    def spec(self) -> Any:
        """EnvPool's EnvSpec for one env (cheap: no env is built)."""
        if self._spec is None:
            self._spec = _envpool().make_spec(self.task_id, **self.make_kwargs)
        return self._spec

    def _spaces_now(self) -> tuple[gym.Space, gym.Space]:
        if self._spaces is None:
            with warnings.catch_warnings():  # gymnasium warns when EnvPool's float64 bounds go float32
                warnings.simplefilter("ignore", UserWarning)
                self._spaces = (self.spec.gymnasium_observation_space, self.spec.gymnasium_action_space)
        return self._spaces

    @property
    def observation_space(self) -> gym.Space:
        return self._spaces_now()[0]

    @property
    def action_space(self) -> gym.Space:
        return self._spaces_now()[1]

    @property
    def num_threads(self) -> int | None:
        n = self.make_kwargs.get("num_threads")
        return int(n) if n else None

    # ------------------------------------------------------------------ building
    def make_pool(self, seeds: Sequence[int], num_threads: int | None = None) -> Any:
        """A sync gymnasium EnvPool of ``len(seeds)`` envs; pool env j is seeded ``seeds[j]``
        (wrapped to int32, see :func:`to_int32_seed`)."""
        seeds = [to_int32_seed(s) for s in seeds]
        kw = dict(self.make_kwargs)
        if num_threads is not None:
            kw["num_threads"] = int(num_threads)
        # with `env_seed` set, EnvPool's base `seed` is unused: pool env j is seeded seeds[j]
        pool = _envpool().make(self.task_id, env_type="gymnasium", num_envs=len(seeds),
                               batch_size=len(seeds), env_seed=seeds, **kw)
        with warnings.catch_warnings():  # the pool builds (and caches) its spaces on first use
            warnings.simplefilter("ignore", UserWarning)
            _ = (pool.observation_space, pool.action_space)
        return pool

    def __call__(self) -> "EnvPoolEnv":
        return EnvPoolEnv(self)

    make_probe = __call__

    def make_runner(self, env_ids: Sequence[int], seed: int, generation: int = 0,
                    id_offset: int = 0) -> "EnvPoolRunner":
        """The runner of envs ``env_ids``: one :class:`EnvPoolRunner` (EnvPool's own threaded
        pool), which the executor's ``make_env_runner`` asks a source for when it has this
        method, instead of an ``EnvRunner`` stepping one env per factory.

        ``id_offset`` > 0 (this source in a slice of a larger collection, e.g. a second Ray
        actor) is not supported yet: EnvPoolRunner's env ids are the pool's global ids.
        """
        if id_offset:
            raise NotImplementedError("an EnvPool source in a slice of a larger collection (env_id_offset > 0, "
                                      "e.g. a second Ray actor) is not supported yet; use a gymnasium id")
        return EnvPoolRunner(env_ids, self, seed, generation)

    # ------------------------------------------------------------------ value semantics
    def __getstate__(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "make_kwargs": self.make_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.task_id, self.make_kwargs = state["task_id"], state["make_kwargs"]
        self._spec, self._spaces = None, None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EnvPoolSource):
            return NotImplemented
        return self.task_id == other.task_id and self.make_kwargs == other.make_kwargs

    __hash__ = None  # type: ignore[assignment]  # make kwargs may hold unhashable values

    def __repr__(self) -> str:
        kw = "".join(f", {k}={v!r}" for k, v in self.make_kwargs.items())
        return f"EnvPoolSource({self.task_id!r}{kw})"


class EnvPoolEnv(gym.Env):
    """One EnvPool env as a plain ``gymnasium.Env`` (a one-env pool, one thread).

    ``reset(seed=s)`` rebuilds the pool seeded ``s`` (EnvPool seeds are fixed at creation);
    ``reset()`` after an episode ended does EnvPool's own auto-reset step, so an
    :class:`~auturi.executor.env_runner.EnvRunner` over these envs gives exactly the data of
    an :class:`EnvPoolRunner` with the same seed. Meant as the executor's probe and as a
    reference; for throughput use :class:`EnvPoolRunner`.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, source: EnvPoolSource):
        self.source = source
        self.observation_space = source.observation_space
        self.action_space = source.action_space
        self._pool: Any = None
        self._done = False
        space = self.action_space
        self._noop = np.zeros((1, *(space.shape or ())), dtype=space.dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if options:
            raise ValueError("EnvPoolEnv.reset takes no options")
        if seed is not None or self._pool is None:
            if seed is None:  # never seeded: fresh entropy, as gymnasium envs do
                seed = int(np.random.SeedSequence().generate_state(1)[0])
            self.close()
            self._pool = self.source.make_pool([seed], num_threads=1)
            obs, info = self._pool.reset()
        elif self._done:  # EnvPool's auto-reset: a step sent to a finished env resets it
            obs, _, _, _, info = self._pool.step(self._noop)
        else:
            obs, info = self._pool.reset()
        self._done = False
        return np.array(obs[0]), self._info(info)

    def step(self, action):
        if self._pool is None:
            raise RuntimeError("EnvPoolEnv.step before reset()")
        if self._done:
            raise RuntimeError("EnvPoolEnv.step after the episode ended: call reset() first")
        obs, rew, term, trunc, info = self._pool.step(np.asarray([action], dtype=self._noop.dtype))
        te, tr = bool(term[0]), bool(trunc[0])
        self._done = te or tr
        return np.array(obs[0]), float(rew[0]), te, tr, self._info(info)

    @staticmethod
    def _info(info: dict[str, Any]) -> dict[str, Any]:
        out = unbatch_info(info, 0)
        out.pop("env_id", None)  # always 0, the index in its one-env pool: the env does not know its own
        return out

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # the C++ pool joins its threads when the last reference goes


def _as_source(source: Any, env_ids: Sequence[int]) -> EnvPoolSource:
    return one_source(source, env_ids, EnvPoolSource, "EnvPoolRunner")


class _PoolIO:
    """One sync send/recv round trip on a pool.

    EnvPool's Python ``send``/``recv`` wrap the C++ ``_send``/``_recv`` with per-call work
    (the action dict, a rebuilt config dict, pytree unflattening) that costs about as much as
    the C++ round trip itself for a cheap env. For the plain single-player layout -- actions
    ``[env_id, players.env_id, action]``, one ``obs`` state -- we call ``_send``/``_recv``
    directly with arrays of EnvPool's dtypes and pick obs/reward/done/trunc out of the state
    list, and convert the info with EnvPool's own ``_to`` only when an episode ended. Any
    other layout, or an EnvPool without these members, goes through the public API.
    """

    def __init__(self, pool: Any):
        self.pool = pool
        self.raw = False
        try:
            akeys, skeys = list(pool._action_keys), list(pool._state_keys)
            ok = (pool.config.get("max_num_players", 1) == 1 and len(akeys) == 3
                  and akeys[:2] == ["env_id", "players.env_id"]
                  and all(k in skeys for k in ("obs", "reward", "done", "trunc"))
                  and not any(k.startswith(("obs:", "obs.")) for k in skeys)
                  and all(callable(getattr(pool, m, None)) for m in ("_send", "_recv", "_to")))
            if ok:
                aspec = pool.spec.action_array_spec[akeys[2]]
                self.act_dtype = np.dtype(aspec.dtype)
                shape = tuple(aspec.shape)
                # per-env shape of one action: the spec's leading -1 stands for the batch
                self.act_shape = shape[1:] if shape and shape[0] == -1 else shape
                self.i_obs, self.i_rew, self.i_done, self.i_trunc = (
                    skeys.index(k) for k in ("obs", "reward", "done", "trunc"))
                self.raw = True
        except (AttributeError, KeyError, TypeError, ValueError):
            self.raw = False

    def step(self, acts: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, ...]:
        """Send ``acts`` to pool envs ``local`` (int32) and return their
        ``obs, reward, terminated, truncated, state`` in that order."""
        pool = self.pool
        if not self.raw:
            pool.send(acts, local)
            return pool.recv()
        if acts.shape[1:] != self.act_shape:  # C++ would read the buffer with the spec's shape
            raise ValueError(f"actions of shape {acts.shape[1:]} per env; EnvPool expects {self.act_shape}")
        pool._send([local, local, np.ascontiguousarray(acts, dtype=self.act_dtype)])
        st = pool._recv()
        trunc = st[self.i_trunc]
        return st[self.i_obs], st[self.i_rew], st[self.i_done] & ~trunc, trunc, st

    def info(self, state: Any) -> dict[str, Any]:
        """The batched gymnasium info dict of what ``step`` returned as ``state``."""
        return self.pool._to(state, False, True)[4] if self.raw else state


class EnvPoolRunner:
    """Drop-in for :class:`~auturi.executor.env_runner.EnvRunner` backed by one EnvPool.

    Owns envs ``env_ids`` (global indices); pool env j is ``env_ids[j]``, seeded
    ``env_seed(seed, env_ids[j], generation)``. ``step(ts, ids)`` steps exactly envs ``ids``
    once (any subset, any order) with SB3 auto-reset; see the module docstring for how.

    ``num_threads``: EnvPool worker threads; default the source's ``num_threads`` make kwarg,
    else one per env, at most the cores this process may run on.
    """

    def __init__(self, env_ids: Sequence[int], source: Any, seed: int, generation: int = 0, *,
                 num_threads: int | None = None):
        self.env_ids = [int(i) for i in env_ids]
        if not self.env_ids:
            raise ValueError("EnvPoolRunner needs at least one env")
        if min(self.env_ids) < 0 or len(set(self.env_ids)) != len(self.env_ids):
            raise ValueError(f"env_ids must be distinct indices >= 0, got {self.env_ids}")
        self.source = _as_source(source, self.env_ids)
        self.seed, self.generation = int(seed), int(generation)
        self.fresh = True  # not reset yet: the next collect must reset first
        self.finals: dict[tuple[int, int], tuple[np.ndarray, dict]] = {}
        self.env_seconds = 0.0
        self.a: dict[str, np.ndarray] = {}
        n = len(self.env_ids)
        self.num_threads = max(1, min(num_threads or self.source.num_threads or n, n, _available_cores()))
        if isinstance(self.source.observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            raise TypeError(f"{self.source}: Dict/Tuple observations are not supported")
        space = self.source.action_space
        self._noop = np.zeros((n, *(space.shape or ())), dtype=space.dtype)  # ignored by a reset step
        self._ids = np.asarray(self.env_ids, dtype=np.int64)
        self._local = np.full(int(self._ids.max()) + 1, -1, dtype=np.int32)  # global -> pool index
        self._local[self._ids] = np.arange(n, dtype=np.int32)
        self.pool: Any = self._make_pool()
        self._io: _PoolIO | None = _PoolIO(self.pool)
        self._pool_used = False

    def _make_pool(self) -> Any:
        seeds = [env_seed(self.seed, i, self.generation) for i in self.env_ids]
        return self.source.make_pool(seeds, num_threads=self.num_threads)

    def bind(self, arrays: dict[str, np.ndarray]) -> None:
        self.a = arrays

    def reset_all(self) -> None:
        """First reset of every env: writes row 0 of ``obs`` and sets ``starts[0]``."""
        if self.pool is None:
            raise RuntimeError("EnvPoolRunner is closed")
        if self._pool_used:  # EnvPool seeds at creation: start again from the seeds
            self.pool.close()
            self.pool = None
            self.pool = self._make_pool()
            self._io = _PoolIO(self.pool)
        obs, _ = self.pool.reset()  # sync: rows in pool order, i.e. env_ids order
        self._pool_used = True
        self.a["obs"][0, self._ids] = obs
        self.a["starts"][0, self._ids] = True
        self.fresh = False

    def _pool_index(self, ids: np.ndarray) -> np.ndarray:
        return runner_slots(self._local, ids, self.env_ids)

    def step(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        """Step env ``ids[k]`` with the action at row ``ts[k]``; write row ``ts[k] + 1``."""
        a = self.a
        ts = np.asarray(ts, dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        io = self._io
        if io is None:
            raise RuntimeError("EnvPoolRunner is closed")
        local = self._pool_index(ids)
        acts = a["actions"][ts, ids]
        t0 = time.perf_counter()
        obs, rew, term, trunc, state = io.step(acts, local)
        done = term | trunc
        ended = np.flatnonzero(done)
        if ended.size:
            final_obs = obs[ended].copy()
            # EnvPool resets a finished env on its next step (ignoring the action): do that step now
            reset_obs = io.step(self._noop[:ended.size], local[ended])[0]
        self.env_seconds += time.perf_counter() - t0
        a["rewards"][ts, ids] = rew
        a["terminated"][ts, ids] = term
        a["truncated"][ts, ids] = trunc
        a["starts"][ts + 1, ids] = done
        a["obs"][ts + 1, ids] = obs
        if ended.size:
            a["obs"][ts[ended] + 1, ids[ended]] = reset_obs
            info = io.info(state)
            for j, k in enumerate(ended.tolist()):
                i = int(ids[k])
                inf = unbatch_info(info, k)
                inf["env_id"] = i  # EnvPool's is the index inside this pool
                self.finals[(int(ts[k]), i)] = (final_obs[j], inf)

    def take_finals(self) -> dict[tuple[int, int], tuple[np.ndarray, dict]]:
        f, self.finals = self.finals, {}
        return f

    def close(self) -> None:
        pool, self.pool, self._io = self.pool, None, None
        if pool is not None:  # the C++ pool joins its threads when the last reference goes
            try:
                pool.close()
            except Exception:  # closing is best effort; the process may be going down
                pass
