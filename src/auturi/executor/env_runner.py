"""The envs one process steps (:class:`EnvRunner`), with SB3's auto-reset, writing every
result in place into the rollout arrays. The serial loop, an actor's in-process envs and env
workers all use it, so stepping semantics live in one place.

Actions reach an env as SB3's ``DummyVecEnv`` hands them: env ``i`` at row ``t`` gets
``actions[t, i]`` as numpy indexing gives it, a numpy scalar of the actions' dtype
(``np.int64`` for SB3's ``Discrete``) when one action is a scalar, else a numpy array of
that dtype (Box, MultiDiscrete, MultiBinary), a copy the env may keep. Never a Python int or
a list: an env that computes with its action would step differently (a float32 state times
an ``np.int64`` is float64, times a Python int float32).

Each env's first reset and first step are checked against gymnasium's API and the rollout
arrays (``spec.check_*``); an exception an env raises gets a note naming the env."""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from auturi.envs import env_seed
from auturi.executor.spec import EnvCheckError, check_reset_output, check_step_output

LARGE_OBS_BYTES = 16384
"""Observations at least this large are copied into the rollout block one env at a time on
the gathered path (:meth:`EnvRunner.step`): stacking them first for one fancy-indexed
assignment made a second copy of every frame in a fresh allocation, while for small
observations that one vectorised assignment is cheaper than a Python loop (64 CartPoles:
~5 us against ~20 us)."""


class EnvRunner:
    """Owns envs ``env_ids`` (global indices), made from ``env_fns[i]`` and seeded
    ``env_seed(seed, id_offset + i, generation)`` at their first reset (``id_offset``: see
    ``Executor.env_id_offset``; 0 unless the executor runs a slice of a larger collection).

    ``finals`` collects, per ended episode at ``(t, i)``, the real last observation and the
    info the env returned; the host hands them over at the end of a collect.
    """

    def __init__(self, env_ids: Sequence[int], env_fns: Sequence[Callable[[], gym.Env]], seed: int,
                 generation: int = 0, id_offset: int = 0, live: Mapping[int, Any] | None = None):
        self.env_ids = list(env_ids)
        live = live or {}
        # every new env starts behind a stand-in that checks its first reset and step, then
        # steps aside; a live env (``live``: moved here from another runner, mid-episode) was
        # checked where it started and goes on from where it was, without a reset
        self.envs = {i: live[i] if i in live else _FirstCalls(env_fns[i](), i, self) for i in self.env_ids}
        self._unreset = [i for i in self.env_ids if i not in live]  # the next collect resets these first
        self._warned: set[int] = set()
        self.seed, self.generation, self.id_offset = seed, generation, id_offset
        self.finals: dict[tuple[int, int], tuple[np.ndarray, dict]] = {}
        self.env_seconds = 0.0
        self.a: dict[str, np.ndarray] = {}
        self._slice_key: tuple[int, int] | None = None
        self._slice_list: list = []
        self._cols: dict[int, tuple] = {}

    def bind(self, arrays: dict[str, np.ndarray]) -> None:
        self.a = arrays
        self._cols = {}

    @property
    def fresh(self) -> bool:
        """True while some env awaits its first reset (the next collect must reset first)."""
        return bool(self._unreset)

    def reset_all(self) -> None:
        """First reset of every env not reset yet: writes row 0 of ``obs`` and sets
        ``starts[0]`` for them. Live envs (moved here) keep their row 0 and their episode."""
        obs, starts = self.a["obs"], self.a["starts"]
        for i in self._unreset:
            try:
                o, _ = self.envs[i].reset(seed=env_seed(self.seed, self.id_offset + i, self.generation))
            except Exception as e:
                raise _name_env(e, i, "in its first reset()")
            obs[0, i] = o
            starts[0, i] = True
        self._unreset = []

    def take_envs(self, ids: Sequence[int]) -> dict[int, Any]:
        """Hand envs ``ids`` over to another runner (:class:`EnvRunner` ``live=``) as they are,
        mid-episode; those not reset yet are left out (their new runner makes them anew, with
        the same seed: the same data). This runner no longer steps any of ``ids``."""
        out = {}
        for i in ids:
            env = self.envs.pop(i)
            if i not in self._unreset:
                out[i] = env.env if isinstance(env, _FirstCalls) else env
        self.env_ids = [i for i in self.env_ids if i in self.envs]
        self._unreset = [i for i in self._unreset if i in self.envs]
        self._cols, self._slice_key, self._slice_list = {}, None, []
        return out

    def export_envs(self) -> dict[int, bytes | None]:
        """Every env of this runner, cloudpickled mid-episode, for a runner in another process
        (``None``: not reset yet, made anew there with the same seed; ``b""``: it failed to
        pickle, so it is recreated and its episode cut). Closes nothing: the caller closes
        this runner."""
        import cloudpickle

        out: dict[int, bytes | None] = {}
        unreset = set(self._unreset)
        for i, env in self.envs.items():
            if i in unreset:
                out[i] = None
                continue
            try:
                out[i] = cloudpickle.dumps(env.env if isinstance(env, _FirstCalls) else env)
            except Exception:  # the probe at start passed but this one cannot travel: recreated
                out[i] = b""
        return out

    def step(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        """Step env ``ids[k]`` with the action at row ``ts[k]``; write row ``ts[k] + 1``.

        Reads and writes go through one fancy-indexed numpy operation per array for the
        whole task rather than one per env: per-env numpy scalar access cost as much as a
        CartPole step."""
        a = self.a
        ts = np.asarray(ts, dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        acts_in = list(a["actions"][ts, ids])  # numpy scalars or rows of the copy the gather made
        envs, finals = self.envs, self.finals
        n = len(ids)
        new_obs: list = [None] * n
        rews = [0.0] * n
        terms = [False] * n
        truncs = [False] * n
        t0 = time.perf_counter()
        k = i = 0
        try:
            for k, i in enumerate(ids.tolist()):
                env = envs[i]
                o, rews[k], te, tr, info = env.step(acts_in[k])
                if te or tr:
                    finals[(int(ts[k]), i)] = (np.asarray(o).copy(), info)
                    o, _ = env.reset()
                    terms[k], truncs[k] = te, tr and not te  # as step_slice: a time limit hit by a terminal step is a termination
                new_obs[k] = o
        except Exception as e:
            raise _name_env(e, i, _where(finals, int(ts[k]), i))
        self.env_seconds += time.perf_counter() - t0
        a["rewards"][ts, ids] = rews
        a["terminated"][ts, ids] = terms
        a["truncated"][ts, ids] = truncs
        a["starts"][ts + 1, ids] = np.logical_or(terms, truncs)
        obs = a["obs"]
        if n == 1 or obs[0, 0].nbytes >= LARGE_OBS_BYTES:
            for k, o in enumerate(new_obs):  # straight into the block: no stacked copy
                obs[ts[k] + 1, ids[k]] = o
        else:
            obs[ts + 1, ids] = np.stack(new_obs)

    def step_slice(self, t: int, lo: int, hi: int) -> None:
        """Step envs ``lo..hi-1`` (all of this runner's, contiguous) at row ``t``: the same
        as :meth:`step` with basic slices instead of gathers, for the serial and lockstep
        loops where every env is at the same row (fancy indexing cost ~10 us a step)."""
        if hi - lo == 1:
            self.step_one(t, lo)
            return
        a = self.a
        acts = a["actions"][t, lo:hi]
        acts_in = list(acts) if acts.ndim == 1 else list(acts.copy())  # numpy scalars, or rows an env may keep
        finals = self.finals
        n = hi - lo
        new_obs: list = [None] * n
        rews = [0.0] * n
        ends = [False] * n
        terms = [False] * n
        t0 = time.perf_counter()
        k = 0
        try:
            for k, env in enumerate(self._slice_envs(lo, hi)):
                o, rews[k], te, tr, info = env.step(acts_in[k])
                if te or tr:
                    finals[(t, lo + k)] = (np.asarray(o).copy(), info)
                    o, _ = env.reset()
                    ends[k], terms[k] = True, te
                new_obs[k] = o
        except Exception as e:
            raise _name_env(e, lo + k, _where(finals, t, lo + k))
        self.env_seconds += time.perf_counter() - t0
        a["rewards"][t, lo:hi] = rews
        a["starts"][t + 1, lo:hi] = ends
        if any(ends):
            a["terminated"][t, lo:hi] = terms
            a["truncated"][t, lo:hi] = [e and not te for e, te in zip(ends, terms)]
        else:  # rows are reused across collects: clear what a previous collect wrote
            a["terminated"][t, lo:hi] = False
            a["truncated"][t, lo:hi] = False
        if n == 1:
            a["obs"][t + 1, lo] = new_obs[0]
        else:
            a["obs"][t + 1, lo:hi] = new_obs  # numpy copies a list of frames in place, unstacked

    def step_one(self, t: int, i: int) -> bool:
        """Step env ``i`` alone at row ``t``: the same as :meth:`step_slice` on ``i..i+1``,
        written for the layout with one env per worker, where this is all a worker does per
        step. It writes through column views made once per rollout block, with scalar
        stores: each numpy call of the general path costs ~1 us, and with many workers per
        core it runs cache-cold after every context switch (16 one-env workers on 2 cores:
        ~20k steps/s through ``step_slice``, ~26k with this path, both blocking waits).
        Returns whether the episode ended (a final was recorded), so a worker's row loop
        knows without looking at ``finals``."""
        cols = self._cols.get(i)
        if cols is None:
            a = self.a
            # Scalar stores through memoryviews: plain CPython (~60 ns) where a numpy scalar
            # store goes through numpy's casting machinery (~150 ns hot, far more cold); values
            # are converted exactly as numpy would (C casts). The action is read with numpy
            # (a scalar index of a 1-D view, ~100 ns) because the env must get a numpy value.
            act = a["actions"][:, i]
            cols = self._cols[i] = (self.envs[i], act, act.ndim > 1, a["obs"][:, i], memoryview(a["rewards"][:, i]),
                                    memoryview(a["terminated"][:, i]), memoryview(a["truncated"][:, i]),
                                    memoryview(a["starts"][:, i]))
        env, act, shaped, obs, rew, term, trunc, starts = cols
        action = act[t].copy() if shaped else act[t]
        t0 = time.perf_counter()
        try:
            o, r, te, tr, info = env.step(action)
            ended = bool(te or tr)
            if ended:
                self.finals[(t, i)] = (np.asarray(o).copy(), info)
                o, _ = env.reset()
        except Exception as e:
            raise _name_env(e, i, _where(self.finals, t, i))
        self.env_seconds += time.perf_counter() - t0
        rew[t] = float(r)
        term[t] = bool(te)
        trunc[t] = ended and not te
        starts[t + 1] = ended
        obs[t + 1] = o
        return ended

    def _slice_envs(self, lo: int, hi: int) -> list:
        key = (lo, hi)
        if self._slice_key != key:
            self._slice_key, self._slice_list = key, [self.envs[i] for i in range(lo, hi)]
        return self._slice_list

    def take_finals(self) -> dict[tuple[int, int], tuple[np.ndarray, dict]]:
        f, self.finals = self.finals, {}
        return f

    def _checked(self, what: str, i: int, out: Any) -> Any:
        """``out``, what env ``i`` returned from its first ``what``, once checked (raises
        :class:`~auturi.executor.spec.EnvCheckError`; warns once per env of values the
        rollout's dtype cannot hold)."""
        row = self.a["obs"][0, i]
        check = check_reset_output if what == "reset" else check_step_output
        warning = check(out, i, self.envs[i], row)
        if warning and i not in self._warned:
            self._warned.add(i)
            warnings.warn(warning, RuntimeWarning, stacklevel=2)
        return out

    def _unwrap(self, i: int) -> None:
        """Put env ``i`` itself in place of its stand-in, and drop the caches that held it."""
        self.envs[i] = self.envs[i].env
        self._cols.pop(i, None)
        self._slice_key, self._slice_list = None, []

    def close(self) -> None:
        for env in self.envs.values():
            try:
                env.close()
            except Exception:  # closing is best effort; the process may be going down
                pass
        self.envs = {}
        self._cols, self._slice_list, self._slice_key = {}, [], None


class _FirstCalls:
    """Stands in for env ``i`` in ``EnvRunner.envs`` until its first step: checks what its
    first reset and first step return, then puts the env back in its place, so no stepping
    path pays for the check afterwards (a per-step flag would cost every step)."""

    __slots__ = ("env", "i", "runner", "reset_checked")

    def __init__(self, env: gym.Env, i: int, runner: EnvRunner):
        self.env, self.i, self.runner, self.reset_checked = env, i, runner, False

    def __getattr__(self, name: str) -> Any:  # spaces, and anything else asked of the env
        return getattr(self.env, name)

    def reset(self, **kw: Any) -> Any:
        out = self.env.reset(**kw)
        if not self.reset_checked:
            self.reset_checked = True
            self.runner._checked("reset", self.i, out)
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        self.runner._unwrap(self.i)
        return self.runner._checked("step", self.i, out)

    def close(self) -> None:
        self.env.close()


def _where(finals: dict, t: int, i: int) -> str:
    # a final recorded for (t, i) means the step returned and the reset after it raised
    return f"in reset() after its episode ended at row {t}" if (t, i) in finals else f"in step() at row {t}"


def _name_env(e: Exception, i: int, where: str) -> Exception:
    """``e`` with a note naming env ``i``: the traceback, and a worker's ``WorkerError``,
    then say which env failed. Auturi's own env checks name it already."""
    if not isinstance(e, EnvCheckError):
        e.add_note(f"(raised by env {i} {where})")
    return e


def make_env_runner(env_ids: Sequence[int], env_fns: Sequence[Any], seed: int, generation: int = 0,
                    id_offset: int = 0, live: Mapping[int, Any] | None = None):
    """The runner for these envs: the source's own, when ``env_fns[env_ids[0]]`` has a
    ``make_runner(env_ids, seed, generation, id_offset)`` method (EnvPool's threaded pool:
    the thesis' Fig. 5.2 lets an actor's env side be any vectorised env), else an
    :class:`EnvRunner` (which takes ``live`` envs moved from another runner)."""
    source = env_fns[env_ids[0]]
    make_runner = getattr(source, "make_runner", None)
    if make_runner is not None:
        return make_runner(list(env_ids), seed, generation, id_offset)
    return EnvRunner(env_ids, env_fns, seed, generation, id_offset, live)
