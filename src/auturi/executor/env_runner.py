"""The envs one process steps (:class:`EnvRunner`), with SB3's auto-reset, writing every
result in place into the rollout arrays. The serial loop, an actor's in-process envs and env
workers all use it, so stepping semantics live in one place.

Actions reach an env as SB3's ``DummyVecEnv`` hands them: env ``i`` at row ``t`` gets
``actions[t, i]`` as numpy indexing gives it, a numpy scalar of the actions' dtype
(``np.int64`` for SB3's ``Discrete``) when one action is a scalar, else a numpy array of
that dtype (Box, MultiDiscrete, MultiBinary), a copy the env may keep. Never a Python int or
a list: an env that computes with its action would step differently (a float32 state times
an ``np.int64`` is float64, times a Python int float32).

Every reset and step of every env is checked against gymnasium's API and the rollout arrays
(the rules: ``spec``, "env output checks") by a stand-in that holds the env in
``EnvRunner.envs`` (:class:`_Checked`), so every stepping path, in every layout and process,
checks the same way and raises the same :class:`~auturi.errors.EnvCheckError`. Its fast path
is one signature compare a call (measured on 2026-11-26 with ``bench/envcheck.py``: 4.1% more
instructions per step for serial CartPole with a constant policy, the cheapest step there is,
0.5% for HalfCheetah); anything else goes to ``spec``'s thorough check. An exception an env
raises gets a note naming the env and the row; an ``EnvCheckError`` gets the same words in its
message.

Calls on the live envs (``env_method``, ``get_attr``, ``set_attr`` through the executor):
:meth:`EnvRunner.call` runs one on this runner's envs; the call itself, its trip to other
processes and the checks of whether envs travel with their state are :mod:`auturi.executor.env_calls`.

Over 400 lines because the stepping paths and the stand-ins every call of theirs goes through
are one cost budget, read together: a line added to either is paid per env step."""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from auturi.envs import env_seed
from auturi.errors import EnvCallError
from auturi.executor.env_calls import EnvCall, Unreset, dumps_env, live_env, travels_whole
from auturi.executor.spec import BOOL_TYPES, EnvCheckError, check_reset_output, check_step_output, finite_values

_ndarray = np.ndarray

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

    ``defer``: envs not ``live`` are made at their first reset or env call instead of now
    (:meth:`_make`); one handed on before either is never made here.

    ``check_finite``: NaN or inf in an observation (as stored) or a reward is an
    :class:`~auturi.errors.EnvCheckError` (off by default, as in gymnasium's checker; on, it
    costs an ``isfinite`` over each observation: 28% more instructions a CartPole step,
    ``bench/envcheck.py``). ``check_steps`` (``False``: only each env's first
    reset and first step are checked, as before 2026-11-26) exists to measure what the checks
    cost (``bench/envcheck.py``); leave it on.

    ``on_progress``, when set, is called with no argument after each single env's reset or
    step returned and passed its check (every stepping path): a worker can show progress per
    env. ``None`` (the default) costs nothing. Not called for envs no longer checked
    (``check_steps=False``).
    """

    _on_progress: Callable[[], None] | None = None

    @property
    def on_progress(self) -> Callable[[], None] | None:
        return self._on_progress

    @on_progress.setter
    def on_progress(self, fn: Callable[[], None] | None) -> None:
        self._on_progress = fn
        cls = _STAND_INS[self.check_finite, fn is not None]
        for env in self.envs.values():
            if isinstance(env, _Checked):
                env.__class__ = cls  # same slots: the step caches holding it stay valid

    def __init__(self, env_ids: Sequence[int], env_fns: Sequence[Callable[[], gym.Env]], seed: int,
                 generation: int = 0, id_offset: int = 0, live: Mapping[int, Any] | None = None,
                 check_finite: bool = False, check_steps: bool = True, defer: bool = False):
        self.env_ids = list(env_ids)
        self.check_finite, self.check_steps = bool(check_finite), bool(check_steps)
        live = live or {}
        # every env, new or live (``live``: moved here from another runner, mid-episode; it goes
        # on from where it was, without a reset), stands behind its checking stand-in.
        # ``defer``: new envs are made at their first reset or env call (see _make), so envs
        # handed on before either (take_envs, export_envs) are never made here.
        stand_in = _STAND_INS[self.check_finite, False]
        self._pending: dict[int, Callable[[], gym.Env]] = \
            {i: env_fns[i] for i in self.env_ids if i not in live} if defer else {}
        self.envs = {i: stand_in(live_env(live[i]) if i in live else env_fns[i](), i, self)
                     for i in self.env_ids if i not in self._pending}
        # the next collect resets these first: new envs, and envs an env call changed before
        # their first reset (they travel as Unreset, to be reset by their new runner)
        self._unreset = [i for i in self.env_ids if i not in live or isinstance(live[i], Unreset)]
        # envs not reset yet that an env call changed: they must travel (take_envs, export_envs)
        self._touched = {i for i in self.env_ids if isinstance(live.get(i), Unreset)}
        # after each env call that may change envs: env -> whether its pickle keeps it whole
        # (travels_whole); off where envs never move (the serial backend)
        self.travel_checks: dict[int, bool] = {}
        self.check_travel = True
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

    def _make(self, ids: Sequence[int] | None = None) -> None:
        """Make the deferred envs among ``ids`` (all when None), in ``env_ids`` order, each
        behind the stand-in the runner's settings now call for. A runner that defers its new
        envs (``defer=True``) pays for them only if it keeps them: an online tuner that moves
        the caller's envs to env workers before the first collect has them made there, in
        parallel, and never here (on the H200 box of 2026-11-27, 32 Atari envs took about 6 s
        of the caller's wrap, one after another, before the move made them again)."""
        if not self._pending:
            return
        want = self._pending.keys() if ids is None else set(ids) & self._pending.keys()
        stand_in = _STAND_INS[self.check_finite, self._on_progress is not None]
        for i in [i for i in self.env_ids if i in want]:
            self.envs[i] = stand_in(self._pending.pop(i)(), i, self)

    @property
    def fresh(self) -> bool:
        """True while some env awaits its first reset (the next collect must reset first)."""
        return bool(self._unreset)

    def reset_all(self) -> None:
        """First reset of every env not reset yet: writes row 0 of ``obs`` and sets
        ``starts[0]`` for them. Live envs (moved here) keep their row 0 and their episode."""
        self._make()
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
        the same seed: the same data), unless an env call changed them: those travel as
        :class:`Unreset` (made anew, the change would be lost). This runner no longer steps
        any of ``ids``."""
        out: dict[int, Any] = {}
        unreset = set(self._unreset)
        for i in ids:
            if self._pending.pop(i, None) is not None:
                continue  # never made: not reset, no call changed it (a call makes it first)
            env = self.envs.pop(i)
            env = env.env if isinstance(env, _Checked) else env
            if i not in unreset:
                out[i] = env
            elif i in self._touched:
                out[i] = Unreset(env)
        self.env_ids = [i for i in self.env_ids if i in self.envs or i in self._pending]
        self._unreset = [i for i in self._unreset if i in self.envs or i in self._pending]
        self._touched &= set(self.envs)
        self._cols, self._slice_key, self._slice_list = {}, None, []
        return out

    def export_envs(self) -> dict[int, bytes | None]:
        """Every env of this runner, cloudpickled mid-episode, for a runner in another process
        (``None``: not reset yet, made anew there with the same seed, unless an env call
        changed it: then it is pickled as :class:`Unreset`; ``b""``: it failed to pickle, so
        it is recreated and its episode cut, and the executor refuses that for an env a call
        changed). Closes nothing: the caller closes this runner."""
        out: dict[int, bytes | None] = dict.fromkeys(self._pending)  # never made: made anew there
        unreset = set(self._unreset)
        for i, env in self.envs.items():
            env = env.env if isinstance(env, _Checked) else env
            if i in unreset:
                if i not in self._touched:
                    out[i] = None
                    continue
                env = Unreset(env)
            try:
                out[i] = dumps_env(env)
            except Exception:  # the probe at start passed but this one cannot travel: recreated
                out[i] = b""
        return out

    def call(self, call: EnvCall) -> dict[int, Any]:
        """Run ``call`` on this runner's envs among ``call.ids`` (this runner's keys), in their
        order: position in ``call.ids`` -> result, for the positions whose env is here. On the
        env itself (the user's, not its stand-in), as SB3's ``DummyVecEnv`` does. The first env
        that raises stops the call: :class:`EnvCallError` naming it (its global index) and the
        call, the env's exception as its cause."""
        out: dict[int, Any] = {}
        self._make(call.ids)
        envs = self.envs
        unreset = set(self._unreset)
        self.travel_checks = {}
        for pos, i in enumerate(call.ids):
            env = envs.get(i)
            if env is None:
                continue
            if call.changes and i in unreset:
                self._touched.add(i)  # it must travel with the change (take_envs, export_envs)
            user_env = env.env if isinstance(env, _Checked) else env
            try:
                out[pos] = call.apply(user_env)
            except Exception as e:
                raise EnvCallError(self.id_offset + i, call.describe(), e) from e
            if call.changes and self.check_travel and i not in self.travel_checks:
                self.travel_checks[i] = travels_whole(user_env)
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

    def _unwrap(self, i: int) -> None:
        """Put env ``i`` itself in place of its stand-in (``check_steps=False``), and drop the
        caches that held it."""
        self.envs[i] = self.envs[i].env
        self._cols.pop(i, None)
        self._slice_key, self._slice_list = None, []

    def close(self) -> None:
        for env in self.envs.values():
            try:
                env.close()
            except Exception:  # closing is best effort; the process may be going down
                pass
        self.envs, self._pending = {}, {}
        self._cols, self._slice_list, self._slice_key = {}, [], None


class _Checked:
    """Stands in for env ``i`` in ``EnvRunner.envs`` and checks what each of its resets and
    steps returns: the one place of the checks, whatever path or process steps the env.

    The fast path compares the result's signature (the types of its parts, the observation's
    shape and dtype) with the last one ``spec``'s thorough check accepted for this env and
    kind of call: one tuple built and compared a step (~2,200 instructions on CPython 3.11, the
    stand-in's call ~500 more: 3-4% of a CartPole step's; ``bench/envcheck.py``; tests of each
    part one by one cost more). Any other signature, and each env's first reset and first
    step, get the thorough check, which raises
    :class:`EnvCheckError` or accepts (a float64 observation for a float32 row is cast, as
    numpy casts). A signature is learnt only where types decide the verdict (an ndarray
    observation; a Python or numpy scalar reward; bool flags; a dict): an int flag must be 0
    or 1 and a 0-d array reward must stay 0-d, so those are checked in full every time.
    Values are the subclasses' (:class:`_CheckedFinite`), so the plain class pays nothing for
    an option that is off."""

    __slots__ = ("env", "i", "runner", "reset_sig", "step_sig", "reset_seen", "step_seen")

    def __init__(self, env: gym.Env, i: int, runner: EnvRunner):
        self.env, self.i, self.runner = env, i, runner
        self.reset_sig = self.step_sig = _NOT_LEARNT
        self.reset_seen = self.step_seen = False

    # No __getattr__ forwarding to the env: a class with one loses CPython's fast attribute
    # loads on every access, its own slots included (~1,300 instructions a step here). The
    # runner asks its stand-ins for reset, step and close only; the env itself is ``env``.

    def reset(self, **kw: Any) -> Any:
        out = self.env.reset(**kw)
        try:
            o, info = out
            sig = (out.__class__, o.__class__, o.shape, o.dtype, info.__class__)
        except (TypeError, ValueError, AttributeError):  # not a pair, an observation without shape
            sig = None
        if sig != self.reset_sig:
            self._check("reset", out, sig)
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        try:
            o, r, te, tr, info = out
            sig = (o.__class__, o.shape, o.dtype, r.__class__, te.__class__, tr.__class__, info.__class__)
        except (TypeError, ValueError, AttributeError):  # not a 5-tuple (gym<0.26's 4), an observation without shape
            sig = None
        if sig != self.step_sig:  # (a 5-list passes as the 5-tuple it holds would: the data is the same)
            self._check("step", out, sig)
        return out

    def _check(self, what: str, out: Any, sig: tuple | None) -> None:
        """The thorough check of ``out`` (raises EnvCheckError), then ``sig`` learnt where its
        types decide the verdict. The first call of each kind also looks for values the row's
        dtype cannot hold (a warning, once per env) and, with ``check_steps`` off, the first
        step steps aside after it."""
        runner, i = self.runner, self.i
        row = runner.a["obs"][0, i]
        first = not (self.reset_seen if what == "reset" else self.step_seen)
        check = check_reset_output if what == "reset" else check_step_output
        warning = check(out, i, self.env, row.shape, row.dtype, warn_range=first, finite=runner.check_finite)
        if warning and i not in runner._warned:
            runner._warned.add(i)
            warnings.warn(warning, RuntimeWarning, stacklevel=3)
        learn = sig if sig is not None and _decided_by_types(sig) else _NOT_LEARNT
        if what == "reset":
            self.reset_seen, self.reset_sig = True, learn
        else:
            self.step_seen, self.step_sig = True, learn
            if not runner.check_steps:
                runner._unwrap(i)

    def close(self) -> None:
        self.env.close()


_NOT_LEARNT = object()  # equal to no signature, None included: the next call is checked in full


def _decided_by_types(sig: tuple) -> bool:
    """Whether every result with signature ``sig`` gets the verdict the thorough check gave
    the one it accepted: an ndarray observation (its shape and dtype are in ``sig``), a
    Python or numpy scalar reward, bool flags, a dict."""
    if len(sig) == 5:  # a reset's: (result type, observation type, shape, dtype, info type)
        return sig[1] is _ndarray and issubclass(sig[4], dict)
    if sig[0] is not _ndarray:
        return False
    reward, te, tr, info = sig[3:]
    return (issubclass(reward, (int, float, np.number)) and te in BOOL_TYPES and tr in BOOL_TYPES
            and issubclass(info, dict))


class _CheckedFinite(_Checked):
    """:class:`_Checked` under ``check_finite``: each observation (as the row's dtype stores
    it) and reward must also be finite; ``spec``'s thorough check says what is not."""

    __slots__ = ()

    def reset(self, **kw: Any) -> Any:
        out = super().reset(**kw)
        if not finite_values(out[0], 0.0, self.runner.a["obs"].dtype):
            self._check("reset", out, None)  # raises, naming the value
        return out

    def step(self, action: Any) -> Any:
        out = super().step(action)
        if not finite_values(out[0], out[1], self.runner.a["obs"].dtype):
            self._check("step", out, None)
        return out


class _CheckedReporting(_Checked):
    """:class:`_Checked` that also calls ``EnvRunner.on_progress`` after each reset and step:
    a stand-in becomes one (its class is swapped in place) only while a callback is set, so
    without one nothing is paid for it."""

    __slots__ = ()

    def reset(self, **kw: Any) -> Any:
        out = super().reset(**kw)
        self.runner._on_progress()
        return out

    def step(self, action: Any) -> Any:
        out = super().step(action)
        self.runner._on_progress()
        return out


class _CheckedFiniteReporting(_CheckedReporting, _CheckedFinite):
    """Both: finite values, then the progress callback."""

    __slots__ = ()


_STAND_INS = {(False, False): _Checked, (True, False): _CheckedFinite, (False, True): _CheckedReporting,
              (True, True): _CheckedFiniteReporting}  # by (check_finite, on_progress set)


_CALL_CODES = (_Checked.step.__code__, _Checked.reset.__code__)


def env_call_frame(frame: Any) -> Any:
    """The frame of the env reset or step (a stand-in's) that ``frame`` (a thread's innermost
    frame) is inside, or None. While it is the same frame object, that one call has not
    returned: a watchdog tells progress from a stuck env with it, at no cost to the step."""
    while frame is not None:
        if frame.f_code in _CALL_CODES:
            return frame
        frame = frame.f_back
    return None


def env_of_frame(frame: Any) -> int | None:
    """The index of the env whose call :func:`env_call_frame` found."""
    try:
        return int(frame.f_locals["self"].i)
    except Exception:  # not such a frame
        return None


def _where(finals: dict, t: int, i: int) -> str:
    # a final recorded for (t, i) means the step returned and the reset after it raised
    return f"in reset() after its episode ended at row {t}" if (t, i) in finals else f"in step() at row {t}"


def _name_env(e: Exception, i: int, where: str) -> Exception:
    """``e`` with a note naming env ``i`` and where it failed: the traceback, and a worker's
    ``WorkerError``, then say which env failed. An :class:`EnvCheckError` gets the same words
    at the end of its message instead (the message is what a log prints), once."""
    text = f"(raised by env {i} {where})"
    if isinstance(e, EnvCheckError):
        if not getattr(e, "env_where", None) and e.args and isinstance(e.args[0], str):
            e.env_where = text
            e.args = (f"{e.args[0]} {text}",) + e.args[1:]
    else:
        e.add_note(text)
    return e


def make_env_runner(env_ids: Sequence[int], env_fns: Sequence[Any], seed: int, generation: int = 0,
                    id_offset: int = 0, live: Mapping[int, Any] | None = None, check_finite: bool = False,
                    defer: bool = False):
    """The runner for these envs: the source's own, when ``env_fns[env_ids[0]]`` has a
    ``make_runner(env_ids, seed, generation, id_offset)`` method (EnvPool's threaded pool:
    the thesis' Fig. 5.2 lets an actor's env side be any vectorised env; its output is
    EnvPool's own, not checked here), else an :class:`EnvRunner` (which takes ``live`` envs
    moved from another runner, ``check_finite`` and ``defer``)."""
    source = env_fns[env_ids[0]]
    make_runner = getattr(source, "make_runner", None)
    if make_runner is not None:
        return make_runner(list(env_ids), seed, generation, id_offset)
    return EnvRunner(env_ids, env_fns, seed, generation, id_offset, live, check_finite=check_finite, defer=defer)
