"""ale-py's ``AtariVectorEnv`` (ale-py >= 0.11) behind auturi's env-runner interface.

:class:`AleVectorSource` names an Atari game (``"pong"``, ``"Pong-v5"`` or the executor's
``"ale:pong"`` / ``"ale:Pong-v5"`` spelling) plus ``AtariVectorEnv``'s keyword arguments. It is
small and picklable, gives the gymnasium ``observation_space`` / ``action_space`` without
building a vector env (the action count needs the ROM's action set: one ``ALEInterface``,
made once and cached), and calling it returns :class:`AleVectorEnv`, a one-env
``gymnasium.Env`` (the executor's probe, and a per-env factory for
:class:`~auturi.executor.env_runner.EnvRunner`). :class:`AleVectorRunner` is a drop-in for
``EnvRunner`` -- same constructor ``(env_ids, source, seed, generation, id_offset=)``,
attributes, methods and data -- whose envs step in ``AtariVectorEnv``'s C++ threads.

One module on purpose (over 400 lines): the source, the one-env view and the runner share the
game-name, seeding and action rules, and together are the whole ale-py integration.

How ``AtariVectorEnv`` is driven (read from ale-py 0.12.1: ``ale_py/vector_env.py`` and the C++
``src/ale/vector/env_vectorizer.cpp``, ``preprocessed_env.cpp``, ``result_staging.hpp`` and
``src/ale/python/ale_vector_python_interface.cpp``):

* ``AtariVectorEnv`` is a thin Python layer over the C++ ``ALEVectorInterface`` (its ``ale``
  attribute): ``num_envs`` preprocessed envs, each its own ``ALEInterface`` with its own
  no-op RNG (frame skip with max-pooling of the last two frames, OpenCV ``INTER_AREA``
  resize, grayscale, frame stack, no-op starts, FIRE on reset, reward clipping, all in C++),
  and ``num_threads`` worker threads that take per-env work items from one queue. We make it
  in *sync* mode (``batch_size == num_envs``): a result is written to slot ``env_id`` and
  ``recv()`` waits until all ``num_envs`` are in. ``reset``/``send``/``recv`` release the GIL.
  We call ``ale.reset``/``ale.send``/``ale.recv`` directly with the arguments
  ``AtariVectorEnv.reset``/``send``/``recv`` pass (discrete actions, paddle strength 1.0),
  skipping their per-call asserts and array building.
* ``send(actions, paddle_strengths)`` takes exactly ``batch_size`` actions, action k going to
  the env at position k of the last ``recv()``: it has no env ids, so one sync vector env
  steps *all* its envs on every send. (EnvPool's ``send(actions, env_id)`` takes any subset;
  this one cannot.) Hence the runner keeps its envs in ONE ``AtariVectorEnv`` while every
  step names all of them (``whole``: the lockstep loops step every env of a runner each row),
  and the first step that names only some (the overlapped and general loops, a serial
  backend's several actors, a kept worker whose loop a reconfigure changed) moves every env to
  a single-env ``AtariVectorEnv`` of its own, for good; from then on any subset, any order,
  any rows, each env stepping on its own thread. The move gives the same data: each env is
  rebuilt from its seed and the actions it took since ``reset_all`` are replayed into it
  (ALE is deterministic given the seed and the actions, sticky actions, no-op starts and
  auto-resets included); the replayed observations are checked against the whole vector
  env's last ones. Until then the runner keeps those actions, 1 byte per env step (10 MB per
  10M env steps); replaying costs about the env time of the steps replayed, once per runner.
* Seeding: ``reset(env_ids, seeds)`` with a seed >= 0 sets ALE's ``random_seed`` and the
  no-op RNG and reloads the ROM (about 0.1 s per env on a shared 2-core machine,
  2026-11-26); -1 keeps the RNGs going. Seeds are C++ ``int``: env i gets
  ``env_seed(seed, id_offset + i, generation) mod 2**31`` (:func:`ale_seed`), whatever the
  layout. A second ``reset_all`` resets every env with its seed again, so it starts again
  from the seeds (no rebuild needed: ALE takes seeds at reset, EnvPool at creation).
* Auto-reset: in ``NEXT_STEP`` mode (the one we make) an env whose episode is over is reset by
  its next ``send`` (its action ignored). Every env of a group must step on a send, so instead,
  when envs end in a step, we at once call ``reset(ended, -1)``: in sync mode a partial reset
  resets just those envs and reports the others' current state without stepping them. It is
  the same C++ ``PreprocessedEnv::reset()`` the auto-reset calls, so episodes go on exactly as
  ALE's own would. The reset observation goes to ``obs[t+1]``; the real last observation and
  the terminal step's info (``lives``, ``frame_number``, ``episode_frame_number``) to
  ``finals`` (``SAME_STEP`` mode would give the info of the reset state instead).
* Episode ends: ``terminated`` is game over (or a lost life with ``episodic_life=True``),
  ``truncated`` is ``max_num_frames_per_episode`` *frames* (not agent steps) reached, never
  both. With ``episodic_life=True`` ALE's vector env restarts the game after a lost life
  (SB3's ``EpisodicLifeEnv`` and EnvPool continue it): one life is one episode.
* Actions are checked in Python (an integer in ``0..n-1``): an out-of-range action raises in a
  C++ worker thread before its result is written, and ``recv()`` would then wait forever.

Not supported (each raises naming it): ``continuous=True``, ``life_loss_info=True`` (it
reports ``terminated`` without ending the episode), ``thread_affinity_offset`` (every
single-env vector env after a split would pin its thread to the same core). ``ale:pong`` is
not gymnasium's ``ALE/Pong-v5`` with SB3's wrappers: other seeding, no sticky actions by
default (``repeat_action_probability=0.0``), ALE's own C++ preprocessing; the numbers differ
for the same seed.

This module must not import torch (env workers import it); it imports ale-py lazily.
"""
from __future__ import annotations

import inspect
import re
import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from auturi.envs.base import ALE_PREFIX, env_seed, one_source, runner_slots

__all__ = ["AleVectorEnv", "AleVectorRunner", "AleVectorSource", "ale_game", "ale_seed", "ale_vector_available"]

INSTALL = 'pip install "ale-py>=0.11"'
_RESERVED = frozenset({"num_envs", "batch_size", "autoreset_mode", "seed"})  # the runner sets these
_UNSUPPORTED = {  # kwarg -> (its harmless value, why another is refused)
    "continuous": (False, "continuous actions are not supported by auturi's ALE vector env side yet"),
    "life_loss_info": (False, "it reports terminated on a lost life without ending the episode; use "
                              "episodic_life=True, which ends it"),
    "thread_affinity_offset": (-1, "each single-env vector env after a split would pin its thread to the same "
                                   "core"),
}
_INFO_KEYS = ("lives", "frame_number", "episode_frame_number")


def _vector_module() -> Any:
    try:
        from ale_py import vector_env
    except ImportError as e:
        raise ImportError(f"'ale:' envs need ale-py's AtariVectorEnv (ale-py >= 0.11): {INSTALL}") from e
    if not hasattr(vector_env, "AtariVectorEnv"):  # pragma: no cover - depends on the installation
        raise ImportError(f"this ale-py has no AtariVectorEnv (it came in ale-py 0.11): {INSTALL}")
    return vector_env


def ale_vector_available() -> bool:
    """Whether ale-py's ``AtariVectorEnv`` can be imported here."""
    try:
        _vector_module()
    except ImportError:
        return False
    return True


def ale_seed(seed: int) -> int:
    """The seed an ALE vector env gets for ``seed``: ``seed mod 2**31``, a non-negative C++
    ``int`` (ALE reads -1 as "keep the current seed")."""
    return int(seed) % (1 << 31)


def ale_game(name: str) -> str:
    """The ROM id ``AtariVectorEnv`` takes for a game name: ``"pong"`` (a ROM id) as is,
    ``"Pong-v5"``, ``"ALE/Pong-v5"``, ``"MsPacman-v5"`` (gymnasium's and EnvPool's v5 names)
    or ``"MsPacman"`` as ``"pong"`` / ``"ms_pacman"``. The version names no settings: they are
    ``AtariVectorEnv``'s keyword arguments. Raises ``ValueError`` naming close ROM ids."""
    from ale_py import roms
    from ale_py.registration import rom_id_to_name

    if not isinstance(name, str):
        raise TypeError(f"an ALE game must be a string such as 'pong' or 'Pong-v5', got {name!r}")
    rom_ids = list(roms.get_all_rom_ids())
    game = name[len(ALE_PREFIX):] if name.startswith(ALE_PREFIX) else name
    game = game[len("ALE/"):] if game.startswith("ALE/") else game
    if game in rom_ids:
        return game
    m = re.fullmatch(r"([A-Za-z0-9]+)(?:-v(\d+))?", game)
    if m:
        if m.group(2) not in (None, "5"):
            raise ValueError(f"ALE game {name!r}: write the v5 name ({m.group(1)}-v5) or the ROM id; the frame skip, "
                             f"sticky actions and the rest are AtariVectorEnv's keyword arguments")
        by_name = {rom_id_to_name(r): r for r in rom_ids}
        if m.group(1) in by_name:
            return by_name[m.group(1)]
    stem = re.sub(r"-v\d+$", "", game).replace("_", "").lower()[:4]
    close = [r for r in rom_ids if r.replace("_", "").startswith(stem)][:5]
    hint = f" Similar ROM ids: {close}." if close else ""
    raise ValueError(f"unknown ALE game {name!r}.{hint} Write a ROM id ('pong', 'ms_pacman') or a v5 name "
                     f"('Pong-v5'); all: python -c 'import ale_py.roms as r; print(r.get_all_rom_ids())'")


def _available_cores() -> int:
    """This process's cores, capped by its cgroup's CPU quota (:func:`auturi.resources.usable_cores`)."""
    from auturi.resources import usable_cores

    return usable_cores()


def _info(info: dict[str, Any], k: int) -> dict[str, Any]:
    """Env ``k``'s entries of a batched info dict, as Python ints, without ``env_id`` (its
    index inside its vector env)."""
    return {key: int(info[key][k]) for key in _INFO_KEYS}


class AleVectorSource:
    """An Atari game and ``AtariVectorEnv``'s keyword arguments, e.g.
    ``AleVectorSource("pong", episodic_life=True)``; defaults are ``AtariVectorEnv``'s (84x84
    grayscale, 4 stacked frames, frame skip 4 with max-pooling, up to 30 no-op starts, FIRE
    on reset, rewards clipped to [-1, 1], no sticky actions).

    ``num_envs``, ``batch_size``, ``autoreset_mode`` are set by the runner and may not be
    given; ``num_threads`` may (the default thread count of runners). Picklable (caches
    dropped). Calling it returns a one-env :class:`AleVectorEnv`.
    """

    def __init__(self, game: str, **make_kwargs: Any):
        params = inspect.signature(_vector_module().AtariVectorEnv.__init__).parameters
        self.game = ale_game(game)
        bad = sorted(_RESERVED & make_kwargs.keys())
        if bad:
            raise ValueError(f"AleVectorSource sets {bad} itself (per runner); leave them out of the kwargs")
        unknown = sorted(k for k in make_kwargs if k not in params or k in ("self", "game"))
        if unknown:
            known = sorted(k for k in params if k not in ("self", "game") and k not in _RESERVED)
            raise TypeError(f"AtariVectorEnv takes no {unknown}; its keyword arguments: {known}")
        for key, (ok, why) in _UNSUPPORTED.items():
            if key in make_kwargs and make_kwargs[key] != ok:
                raise ValueError(f"AleVectorSource: {key}={make_kwargs[key]!r} is not supported: {why}")
        self.make_kwargs = dict(make_kwargs)
        self._defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        self._num_actions: int | None = None

    def _kw(self, key: str) -> Any:
        return self.make_kwargs.get(key, self._defaults[key])

    # ------------------------------------------------------------------ description
    @property
    def observation_space(self) -> gym.spaces.Box:
        """``AtariVectorEnv``'s single observation space, from the kwargs (no env built)."""
        shape = (int(self._kw("stack_num")), int(self._kw("img_height")), int(self._kw("img_width")))
        if not self._kw("grayscale"):
            shape += (3,)
        return gym.spaces.Box(0, 255, shape, np.uint8)

    @property
    def action_space(self) -> gym.spaces.Discrete:
        if self._num_actions is None:
            if self._kw("full_action_space"):
                self._num_actions = 18  # ALE's legal action set
            else:  # the ROM's minimal action set, as AtariVectorEnv's envs use it
                import ale_py
                from ale_py import roms

                ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # as the vector env's envs set it
                ale = ale_py.ALEInterface()
                ale.loadROM(roms.get_rom_path(self.game))
                self._num_actions = len(ale.getMinimalActionSet())
        return gym.spaces.Discrete(self._num_actions)

    @property
    def num_threads(self) -> int | None:
        n = self.make_kwargs.get("num_threads")
        return int(n) if n else None

    # ------------------------------------------------------------------ building
    def make_vector_env(self, num_envs: int, num_threads: int) -> Any:
        """A sync ``AtariVectorEnv`` of ``num_envs`` envs (``NEXT_STEP`` auto-reset), not reset."""
        kw = dict(self.make_kwargs)
        kw["num_threads"] = int(num_threads)
        env = _vector_module().AtariVectorEnv(self.game, num_envs, batch_size=num_envs, autoreset_mode="NextStep",
                                              **kw)
        if self._num_actions is None:
            self._num_actions = int(env.single_action_space.n)
        if env.single_observation_space != self.observation_space or \
                env.single_action_space.n != self.action_space.n:  # pragma: no cover - a changed ale-py
            _free(env)
            raise RuntimeError(f"{self}: AtariVectorEnv's spaces ({env.single_observation_space}, "
                               f"{env.single_action_space}) differ from the source's; please report")
        return env

    def __call__(self) -> "AleVectorEnv":
        return AleVectorEnv(self)

    make_probe = __call__

    def make_runner(self, env_ids: Sequence[int], seed: int, generation: int = 0,
                    id_offset: int = 0) -> "AleVectorRunner":
        """The runner of envs ``env_ids``: one :class:`AleVectorRunner`, which the executor's
        ``make_env_runner`` asks a source for when it has this method, instead of an
        ``EnvRunner`` stepping one env per factory."""
        return AleVectorRunner(env_ids, self, seed, generation, id_offset=id_offset)

    # ------------------------------------------------------------------ value semantics
    def __getstate__(self) -> dict[str, Any]:
        return {"game": self.game, "make_kwargs": self.make_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["game"], **state["make_kwargs"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AleVectorSource):
            return NotImplemented
        return self.game == other.game and self.make_kwargs == other.make_kwargs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kw = "".join(f", {k}={v!r}" for k, v in self.make_kwargs.items())
        return f"AleVectorSource({self.game!r}{kw})"


def _free(env: Any) -> None:
    """Close a vector env and drop its C++ vectorizer now (its destructor joins its threads),
    not whenever the Python object is collected."""
    try:
        env.close()
    except Exception:  # closing is best effort; the process may be going down
        pass
    env.__dict__.pop("ale", None)


def _actions(acts: np.ndarray, n: int) -> list[int]:
    """Discrete actions as the Python ints ``ale.send`` takes, each checked to be in
    ``0..n-1`` (see the module docstring: C++ would hang on a bad one)."""
    acts = np.asarray(acts)
    if acts.dtype.kind not in "iub":
        raise TypeError(f"ALE actions must be integers (Discrete({n})), got dtype {acts.dtype}")
    if acts.size and (acts.min() < 0 or acts.max() >= n):
        bad = acts[(acts < 0) | (acts >= n)]
        raise ValueError(f"ALE action {bad.flat[0]} is outside Discrete({n}) (0..{n - 1})")
    return acts.reshape(-1).tolist()


class AleVectorEnv(gym.Env):
    """One env as a plain ``gymnasium.Env`` (a one-env ``AtariVectorEnv``, one thread).

    ``reset(seed=s)`` resets it seeded ``ale_seed(s)``; ``reset()`` resets it keeping its RNGs
    going (ALE's own auto-reset), so an :class:`~auturi.executor.env_runner.EnvRunner` over
    these envs gives exactly the data of an :class:`AleVectorRunner` with the same seed.
    Meant as the executor's probe and as a reference; for throughput use the runner.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, source: AleVectorSource):
        self.source = source
        self.observation_space = source.observation_space
        self.action_space = source.action_space
        self._vec: Any = None
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if options:
            raise ValueError("AleVectorEnv.reset takes no options")
        if self._vec is None:
            self._vec = self.source.make_vector_env(1, 1)
            if seed is None:  # never seeded: fresh entropy, as gymnasium envs do
                seed = int(np.random.SeedSequence().generate_state(1)[0])
        obs, info = self._vec.ale.reset([0], [ale_seed(seed) if seed is not None else -1])
        self._done = False
        return obs[0], _info(info, 0)

    def step(self, action):
        if self._vec is None:
            raise RuntimeError("AleVectorEnv.step before reset()")
        if self._done:
            raise RuntimeError("AleVectorEnv.step after the episode ended: call reset() first")
        self._vec.ale.send(_actions(action, self.action_space.n), [1.0])
        obs, rew, term, trunc, info = self._vec.ale.recv()
        te, tr = bool(term[0]), bool(trunc[0])
        self._done = te or tr
        return obs[0], float(rew[0]), te, tr, _info(info, 0)

    def close(self) -> None:
        vec, self._vec = self._vec, None
        if vec is not None:
            _free(vec)


def _as_source(source: Any, env_ids: Sequence[int]) -> AleVectorSource:
    return one_source(source, env_ids, AleVectorSource, "AleVectorRunner")


class _Group:
    """Envs that step together: one ``AtariVectorEnv``; ``members`` are the runner's
    positions (indices into ``env_ids``) of its envs, in vector-env order."""

    def __init__(self, vec: Any, members: np.ndarray):
        self.vec, self.ale, self.members = vec, vec.ale, members
        self.n = len(members)
        self.ones = [1.0] * self.n  # paddle strengths, as AtariVectorEnv.send passes for discrete actions
        self.last_obs: np.ndarray | None = None  # the envs' current observations, vector-env order
        # the actions since the last reset from the seeds: what a split replays (one env never splits)
        self.history = np.zeros((0, self.n), np.uint8) if self.n > 1 else None
        self.steps = 0

    def reset(self, seeds: list[int], slots: list[int] | None = None) -> np.ndarray:
        """Reset every env from ``seeds``, or envs ``slots`` (-1 seeds: ALE's auto-reset)."""
        obs, _ = self.ale.reset(list(range(self.n)) if slots is None else slots, seeds)
        self.last_obs = obs
        if slots is None:
            self.steps = 0
        return obs

    def send(self, acts: list[int]) -> None:
        if self.history is not None:
            if self.steps == len(self.history):  # grow by doubling: amortised O(1) a step
                self.history = np.concatenate([self.history, np.zeros((max(64, self.steps), self.n), np.uint8)])
            self.history[self.steps] = acts
        self.steps += 1
        self.ale.send(acts, self.ones)

    def recv(self) -> tuple[Any, ...]:
        out = self.ale.recv()
        self.last_obs = out[0]
        return out

    def close(self) -> None:
        self.ale = None  # the vectorizer goes with the last reference (see _free)
        _free(self.vec)


class AleVectorRunner:
    """Drop-in for :class:`~auturi.executor.env_runner.EnvRunner` backed by ale-py's
    ``AtariVectorEnv``.

    Owns envs ``env_ids``; env i is seeded ``ale_seed(env_seed(seed, id_offset + i,
    generation))``. ``step(ts, ids)`` steps exactly envs ``ids`` once (any subset, any order)
    with SB3 auto-reset. Its envs live in one ``AtariVectorEnv`` (``whole``) until a step
    names only some of them, then in one single-env ``AtariVectorEnv`` each (module docstring).

    ``num_threads``: the (whole) vector env's worker threads; default the source's
    ``num_threads`` kwarg, else one per env, at most the cores this process may run on.
    """

    def __init__(self, env_ids: Sequence[int], source: Any, seed: int, generation: int = 0, *,
                 id_offset: int = 0, num_threads: int | None = None):
        self.env_ids = [int(i) for i in env_ids]
        if not self.env_ids:
            raise ValueError("AleVectorRunner needs at least one env")
        if min(self.env_ids) < 0 or len(set(self.env_ids)) != len(self.env_ids):
            raise ValueError(f"env_ids must be distinct indices >= 0, got {self.env_ids}")
        self.source = _as_source(source, self.env_ids)
        self.seed, self.generation, self.id_offset = int(seed), int(generation), int(id_offset)
        self.fresh = True  # not reset yet: the next collect must reset first
        self.finals: dict[tuple[int, int], tuple[np.ndarray, dict]] = {}
        self.env_seconds = 0.0
        self.a: dict[str, np.ndarray] = {}
        n = len(self.env_ids)
        self.num_threads = max(1, min(num_threads or self.source.num_threads or n, n, _available_cores()))
        self._ids = np.asarray(self.env_ids, dtype=np.int64)
        self._pos = np.full(int(self._ids.max()) + 1, -1, dtype=np.int64)  # env id -> position in env_ids
        self._pos[self._ids] = np.arange(n)
        self._seeds = [ale_seed(env_seed(self.seed, self.id_offset + i, self.generation)) for i in self.env_ids]
        vec = self.source.make_vector_env(n, self.num_threads)
        self.num_actions = int(vec.single_action_space.n)
        # whole: groups == [all envs], slot of position p is p; else groups[p] holds position p alone
        self.whole = True
        self.groups: list[_Group] = [_Group(vec, np.arange(n))]

    def bind(self, arrays: dict[str, np.ndarray]) -> None:
        self.a = arrays

    def reset_all(self) -> None:
        """Reset every env from its seed (again, on a second call): writes row 0 of ``obs``
        and sets ``starts[0]``."""
        if not self.groups:
            raise RuntimeError("AleVectorRunner is closed")
        t0 = time.perf_counter()
        for g, obs in zip(self.groups, self._reset_from_seeds(self.groups)):
            self.a["obs"][0, self._ids[g.members]] = obs
        self.env_seconds += time.perf_counter() - t0
        self.a["starts"][0, self._ids] = True
        self.fresh = False

    def _reset_from_seeds(self, groups: list[_Group]) -> list[np.ndarray]:
        """Reset every env of ``groups`` from its seed; their observations. A seeded reset
        reloads the ROM (~0.1 s) and ``ale.reset`` waits for it without the GIL, so single-env
        groups reset in parallel threads, as one vector env's envs do on its own threads."""
        def reset(g: _Group) -> np.ndarray:
            return g.reset([self._seeds[p] for p in g.members.tolist()])

        if len(groups) == 1:
            return [reset(groups[0])]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(len(groups), _available_cores())) as pool:
            return list(pool.map(reset, groups))

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        return runner_slots(self._pos, ids, self.env_ids)

    def step(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        """Step env ``ids[k]`` with the action at row ``ts[k]``; write row ``ts[k] + 1``."""
        a = self.a
        ts = np.asarray(ts, dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        if not self.groups:
            raise RuntimeError("AleVectorRunner is closed")
        if self.fresh:
            raise RuntimeError("AleVectorRunner.step before reset_all()")
        pos = self._positions(ids)
        acts = _actions(a["actions"][ts, ids], self.num_actions)  # checked before anything is sent
        if self.whole and len(ids) != len(self.env_ids):
            self._split()
        t0 = time.perf_counter()
        if self.whole:  # one vector env; entry k is its slot pos[k]
            g = self.groups[0]
            buf = np.empty(g.n, dtype=np.int64)
            buf[pos] = acts
            g.send(buf.tolist())
            obs, rew, term, trunc, info = g.recv()
            self.env_seconds += time.perf_counter() - t0
            self._write(g, pos, ts, ids, obs[pos], rew[pos], term[pos], trunc[pos], obs, info)
            return
        gs = [self.groups[p] for p in pos.tolist()]
        for g, act in zip(gs, acts):  # every env starts stepping on its thread before we wait for any
            g.send([act])
        out = [g.recv() for g in gs]
        self.env_seconds += time.perf_counter() - t0
        rew = np.array([o[1][0] for o in out])
        term = np.array([o[2][0] for o in out])
        trunc = np.array([o[3][0] for o in out])
        a["rewards"][ts, ids] = rew
        a["terminated"][ts, ids] = term
        a["truncated"][ts, ids] = trunc
        done = term | trunc
        a["starts"][ts + 1, ids] = done
        obs_rows = a["obs"]
        for k, o in enumerate(out):  # straight into the block: no stacked copy of the frames
            obs_rows[ts[k] + 1, ids[k]] = o[0][0]
        for k in np.flatnonzero(done).tolist():
            o = out[k]
            self._end_episodes(gs[k], np.zeros(1, np.int64), ts[k:k + 1], ids[k:k + 1], o[0], o[4])

    def _write(self, g: _Group, slots: np.ndarray, ts: np.ndarray, ids: np.ndarray, obs: np.ndarray, rew: np.ndarray,
               term: np.ndarray, trunc: np.ndarray, all_obs: np.ndarray, info: dict[str, Any]) -> None:
        a = self.a
        a["rewards"][ts, ids] = rew
        a["terminated"][ts, ids] = term
        a["truncated"][ts, ids] = trunc
        done = term | trunc
        a["starts"][ts + 1, ids] = done
        a["obs"][ts + 1, ids] = obs
        if done.any():
            self._end_episodes(g, slots[done], ts[done], ids[done], all_obs, info)

    def _end_episodes(self, g: _Group, slots: np.ndarray, ts: np.ndarray, ids: np.ndarray, obs: np.ndarray,
                      info: dict[str, Any]) -> None:
        """Envs at ``slots`` of group ``g`` ended their episode at rows ``ts``: keep their final
        observation and info, reset them (ALE's own auto-reset, see the module docstring) and
        write the reset observation to row ``ts + 1``."""
        for s, t, i in zip(slots.tolist(), ts.tolist(), ids.tolist()):
            inf = _info(info, s)
            inf["env_id"] = i  # ALE's is the index inside its vector env
            self.finals[(t, i)] = (obs[s].copy(), inf)
        t0 = time.perf_counter()
        reset_obs = g.reset([-1] * len(slots), slots.tolist())
        self.env_seconds += time.perf_counter() - t0
        self.a["obs"][ts + 1, ids] = reset_obs[slots]

    def _split(self) -> None:
        """Move every env from the whole vector env into one of its own, with the same state:
        each made anew from its seed, the whole one's actions since then replayed into it
        (module docstring), the result checked against the whole one's observations."""
        t0 = time.perf_counter()
        g = self.groups[0]
        singles: list[_Group] = []
        try:
            for p in range(g.n):
                singles.append(_Group(self.source.make_vector_env(1, 1), np.array([p])))
            self._reset_from_seeds(singles)
            for r in range(g.steps):  # each replayed row: all singles step on their own threads
                for p, s in enumerate(singles):
                    s.send([int(g.history[r, p])])
                for s in singles:
                    _, _, te, tr, _ = s.recv()
                    if te[0] or tr[0]:
                        s.reset([-1], [0])
            for p, s in enumerate(singles):
                if g.last_obs is None or not np.array_equal(s.last_obs[0], g.last_obs[p]):
                    raise RuntimeError(f"replaying env {self.env_ids[p]}'s {g.steps} steps into its own vector env "
                                       f"did not give its observation: ALE was not deterministic for "
                                       f"{self.source}; please report")
        except BaseException:
            for s in singles:
                s.close()
            raise
        g.close()
        self.groups, self.whole = singles, False
        self.env_seconds += time.perf_counter() - t0

    def take_finals(self) -> dict[tuple[int, int], tuple[np.ndarray, dict]]:
        f, self.finals = self.finals, {}
        return f

    def close(self) -> None:
        groups, self.groups = self.groups, []
        for g in groups:  # each vectorizer's destructor joins its threads
            g.close()
