"""Calls on the live envs (``Executor.env_method`` / ``get_attr`` / ``set_attr``) and whether
an env travels with its state, for every backend:

- :class:`EnvCall`, one call; :meth:`auturi.executor.env_runner.EnvRunner.call` runs it on a
  runner's envs; :func:`answer_env_call` and :func:`read_env_call_answer` carry it to and from
  another process (pickled); :func:`first_error` picks, of several processes' errors, the one a
  serial loop would have raised (:class:`auturi.errors.EnvCallError`);
- :class:`Unreset`: an env a call changed before its first reset, handed on instead of made anew;
- whether a move keeps an env whole: :func:`travels_with_state` (the probe at start: a copy must
  step as the env does) and :func:`travels_whole` (after each call that may change an env: its
  plain attributes survive the copy). Both copy the env as a move does (:func:`_copy`);
- :func:`dumps_env`, the pickle of a move: cloudpickle's, but an ale-py ``AtariEnv`` carries its
  emulator's state (it pickles as its constructor's arguments, so a moved Atari env restarted)
  and, with sticky actions, the action a sticky frame repeats (:func:`_sticky_action`).
"""
from __future__ import annotations

import copy as copy_module
import functools
import io
import pickle
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from auturi.errors import AuturiError, EnvCallError


ENV_CALL_KINDS = ("method", "get", "set")


@dataclass(frozen=True)
class EnvCall:
    """One call on envs through the executor: ``kind`` ``"method"`` (``name(*args,
    **kwargs)``), ``"get"`` (attribute ``name``) or ``"set"`` (attribute ``name`` to
    ``args[0]``), on the envs ``ids`` (a runner's keys: an executor's local env indices), in
    that order (an index may repeat, as SB3's ``indices`` may). Pickled to reach a worker."""

    kind: str
    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    ids: tuple[int, ...] = ()

    @property
    def changes(self) -> bool:
        """Whether the call may change the env (a method may; reading an attribute does not):
        such an env must travel with its change when a reconfigure moves it."""
        return self.kind != "get"

    def describe(self) -> str:
        """The call as the user wrote it, for messages: ``env_method('set_level')``."""
        return {"method": "env_method", "get": "get_attr", "set": "set_attr"}[self.kind] + f"({self.name!r})"

    def apply(self, env: Any) -> Any:
        """Run the call on one env as SB3's ``DummyVecEnv`` does: methods and attributes are
        looked up through gymnasium wrappers (``get_wrapper_attr``); ``set`` sets the attribute
        on ``env`` itself, the outermost wrapper (``setattr``)."""
        if self.kind == "set":
            setattr(env, self.name, self.args[0])
            return None
        getter = getattr(env, "get_wrapper_attr", None)
        value = getter(self.name) if getter is not None else getattr(env, self.name)
        return value if self.kind == "get" else value(*self.args, **self.kwargs)


class Unreset:
    """An env handed to another runner before its first reset after an env call changed it:
    it travels (as itself, or pickled) instead of being made anew, which would lose the
    change, and its new runner still gives it its first reset (with the seed it would have
    had)."""

    __slots__ = ("env",)

    def __init__(self, env: Any):
        self.env = env

    def __reduce__(self) -> tuple:
        return (Unreset, (self.env,))

    def close(self) -> None:
        self.env.close()


def travels_whole(env: Any) -> bool:
    """Whether ``env`` survives a cloudpickle round trip with its plain values (the int,
    float, bool and str attributes of it and of each gymnasium wrapper around it) as they are:
    what a reconfigure's move does to it. Asked after each env call that may change an env, so
    that a move which would drop the change is refused beforehand: an env that
    does not pickle, and one whose pickle rebuilds it from its constructor's arguments
    (gymnasium's MuJoCo envs, ``EzPickle`` envs: a curriculum level set on them came back as
    the constructor's, and the physics state as the initial one, 2026-11-26)."""
    copy = _copy(env)
    if copy is None:
        return False
    try:
        return all(_plain_values(a) == _plain_values(b) for a, b in zip(_layers(env), _layers(copy), strict=True))
    except (ValueError, TypeError):  # another number of layers, values that do not compare
        return False
    finally:
        _close(copy)


def _layers(env: Any) -> list:
    out = [env]
    while isinstance(out[-1], gym.Wrapper):
        out.append(out[-1].env)
    return out


_PLAIN = (bool, int, float, str, np.bool_, np.integer, np.floating)


def _plain_values(obj: Any) -> dict[str, Any]:
    """``obj``'s plain attributes, NaN as a marker (NaN != NaN would fail every compare)."""
    values = getattr(obj, "__dict__", {})
    return {k: ("nan" if v != v else v) for k, v in values.items() if isinstance(v, _PLAIN)}


def live_env(env: Any) -> Any:
    """The env an :class:`Unreset` carries, or ``env`` itself."""
    return env.env if isinstance(env, Unreset) else env


def no_env_objects_message(source: Any) -> str:
    """Why ``env_method``/``get_attr``/``set_attr`` are refused for a vector-env source."""
    return (f"env_method, get_attr and set_attr call one Python env object per env, and "
            f"{type(source).__name__} ({source}) has none: its envs live inside one vectorised C++ env "
            f"(EnvPool, ale-py's AtariVectorEnv). Set what the envs need when they are made (the id's make "
            f"kwargs), or use the gymnasium id (e.g. 'CartPole-v1' instead of 'envpool:CartPole-v1', "
            f"'ALE/Pong-v5' instead of 'ale:pong'), whose envs take these calls")


def answer_env_call(run: Callable[[EnvCall], dict[int, Any]], request: bytes,
                    checks: Callable[[], dict[int, bool]] = dict) -> bytes:
    """In the process that holds the envs (an env worker, an actor, a Ray actor): unpickle
    the :class:`EnvCall` ``request``, ``run`` it, and pickle the answer for
    :func:`read_env_call_answer`: the results and ``checks()`` (the runner's
    ``travel_checks``: whether each env the call changed still pickles whole), or the exception (an :class:`EnvCallError` whose cause
    unpickles on the other side, the worker's traceback added to it as a note)."""
    import cloudpickle

    try:
        call = cloudpickle.loads(request)
        results = run(call)
    except Exception as e:
        return _error_answer(e)
    try:
        return cloudpickle.dumps(("ok", (results, dict(checks()))))
    except Exception as e:
        what = call.describe()
        return _error_answer(AuturiError(f"{what} returned a value that cannot be pickled to come back from the "
                                         f"process that holds the env ({type(e).__name__}: {e}): return "
                                         f"picklable values (numbers, arrays, dicts), or read what you need in "
                                         f"the method and return that"), note=False)


def _error_answer(e: Exception, note: bool = True) -> bytes:
    """The pickled answer for exception ``e`` (see :func:`answer_env_call`); ``note``: add
    this process's traceback to the cause (not for an error made here, which has none)."""
    import cloudpickle

    cause = e.original if isinstance(e, EnvCallError) else e
    text = "".join(traceback.format_exception(cause))
    try:
        if note and not any(str(n).startswith("(traceback in the process") for n in getattr(cause, "__notes__", ())):
            cause.add_note(f"(traceback in the process that holds the env:\n{text.rstrip()})")  # once: not again in a Ray actor
        cloudpickle.loads(cloudpickle.dumps(cause))  # an exception whose __init__ wants other args fails here
    except Exception:
        cause = RuntimeError(f"{type(cause).__name__}: {cause} (it cannot be pickled; traceback in the "
                             f"process that holds the env:\n{text.rstrip()})")
    if isinstance(e, EnvCallError):
        e = EnvCallError(e.env_id, e.what, cause)
    else:
        e = cause  # type: ignore[assignment]
    try:
        return cloudpickle.dumps(("error", e))
    except Exception:
        return cloudpickle.dumps(("error", RuntimeError(text)))


def read_env_call_answer(answer: bytes) -> tuple[dict[int, Any], dict[int, bool]]:
    """The results and the travel checks :func:`answer_env_call` pickled, or its exception
    raised here."""
    import cloudpickle

    status, value = cloudpickle.loads(answer)
    if status == "ok":
        return value
    if isinstance(value, EnvCallError):
        raise value from value.original
    raise value


def first_error(call: EnvCall, errors: list[BaseException], offset: int = 0) -> BaseException:
    """Of the errors several processes answered ``call`` with, the one a serial loop would
    have raised: the env that comes first in ``call.ids`` (``offset``: the executor's
    ``env_id_offset``, as :class:`EnvCallError` names global envs)."""
    order = {i: p for p, i in reversed(list(enumerate(call.ids)))}

    def position(e: BaseException) -> int:
        return order.get(e.env_id - offset, len(order)) if isinstance(e, EnvCallError) else -1

    return min(errors, key=position)


def dumps_env(env: Any) -> bytes:
    """``env`` pickled for a move to another process: ``cloudpickle.dumps``, except that an
    ale-py ``AtariEnv`` inside it (under any wrappers) also carries its emulator's state,
    random generator included (``ALEInterface.cloneState(include_rng=True)``), and its own
    generator, and with sticky actions the action a sticky frame repeats (:func:`_sticky_action`).
    Its pickle is its constructor's arguments (gymnasium's ``EzPickle``), so before this
    every move of a Pong env restarted its game: the probe saw that and recreated Atari envs,
    cutting every episode a reconfigure moved. Raises what pickling raises."""
    import cloudpickle

    buf = io.BytesIO()
    _pickler_class()(buf, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(env)
    return buf.getvalue()


def _ale_env_class() -> Any:
    mod = sys.modules.get("ale_py.env")  # never imported here: an env of it was made already
    return getattr(mod, "AtariEnv", None)


def _atari_reduce(env: Any) -> Any:
    """The reduction of an ``AtariEnv`` with its state (see :func:`dumps_env`); None when this
    ale-py cannot clone its state, or a continuous env repeats actions (the env then does not
    pickle for a move: its plain pickle would restart the game, which the probe's one step may
    not tell, as Pong's first frames are alike; it is recreated instead)."""
    if getattr(env, "continuous", False) and _sticky(env):
        return None  # its repeated action holds a paddle strength the search does not try
    try:
        state = env.ale.cloneState(include_rng=True)
        last = _sticky_action(env, state) if _sticky(env) else None
    except Exception:
        return None
    extra = {k: v for k, v in vars(env).items() if k in ("_np_random", "_np_random_seed", "spec")}
    return _rebuild_atari, (type(env), tuple(env._ezpickle_args), dict(env._ezpickle_kwargs), state, extra, last)


def _rebuild_atari(cls: type, args: tuple, kwargs: dict, state: Any, extra: dict, last: Any = None) -> Any:
    env = cls(*args, **kwargs)
    env.ale.restoreState(state)
    if last is not None:
        _prime(env.ale, last, state)
    vars(env).update(extra)
    return env


def _sticky(env: Any) -> bool:
    """Whether the ``AtariEnv`` repeats actions at random (``repeat_action_probability > 0``,
    every ``ALE/...-v5`` id by default)."""
    try:
        return float(env.ale.getFloat("repeat_action_probability")) > 0.0
    except Exception:  # no such setting: the default, sticky
        return True


STICKY_FRAMES = 24
"""Frames :func:`_sticky_action` compares and :func:`_prime` acts: a sticky frame repeats
with probability ``p`` (v5: 0.25), so 24 in a row happen with ``p ** 24`` (4e-15)."""


def _sticky_action(env: Any, state: Any) -> Any:
    """The action the emulator repeats on a sticky frame (its last one taken), which its
    ``cloneState`` does not hold (ale-py 0.12.1): a copy restored from that state repeats a
    no-op instead, and its game leaves the env's (a Pong-v5 copy made after a RIGHT
    diverged at its first step for 4 of 12 seeds, 2026-11-27; the one-step probe missed it for
    some seeds, and moved envs' data left the serial loop's).

    Found by trying: from ``state`` the env acts a no-op for :data:`STICKY_FRAMES` frames,
    then, for each legal action, from ``state`` again with that action made the repeated
    one (:func:`_prime`); the first whose frames all match is the one (the same random draws
    make the same frames sticky in both, and after the first frame that takes an action
    the earlier one no longer matters, in this test or in the game that goes on). The env is
    left as it was: ``state``, that action repeated. About a millisecond when the next
    frame takes its action (probability ``1 - p``), up to 18 action trials otherwise."""
    ale = env.ale
    try:
        noop = ale.getLegalActionSet()[0]
        mine = []
        for _ in range(STICKY_FRAMES):
            ale.act(noop)
            mine.append(ale.cloneState().serialize())

        def matches() -> bool:  # stops at the first frame that differs
            for frame in mine:
                ale.act(noop)
                if ale.cloneState().serialize() != frame:
                    return False
            return True

        found = noop
        for action in ale.getLegalActionSet():
            ale.restoreState(state)
            _prime(ale, action, state)
            if matches():
                found = action
                break
    except BaseException:
        ale.restoreState(state)  # the env goes on (a probe's copy, an env call's check): its game as it was
        raise
    ale.restoreState(state)
    _prime(ale, found, state)
    return found


def _prime(ale: Any, action: Any, state: Any) -> None:
    """Make ``action`` the one the emulator repeats, then put it back in ``state`` (which does
    not hold that action): acting it until a frame takes it (each does with probability
    ``1 - p``: :data:`STICKY_FRAMES` tries), then restoring ``state``."""
    for _ in range(STICKY_FRAMES):
        ale.act(action)
    ale.restoreState(state)


@functools.lru_cache(maxsize=None)
def _pickler_class() -> type:
    """cloudpickle's pickler with :func:`_atari_reduce` first (made once, on first use)."""
    import cloudpickle

    class EnvPickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            atari = _ale_env_class()
            if atari is not None and isinstance(obj, atari) and hasattr(obj, "_ezpickle_args"):
                reduced = _atari_reduce(obj)
                if reduced is None:
                    raise pickle.PicklingError(f"{type(obj).__name__}: its emulator's state cannot be carried")
                return reduced
            return super().reducer_override(obj)

    return EnvPickler


def _copy(env: Any) -> Any:
    """``env`` through the round trip a move to another process makes (:func:`dumps_env`);
    None when it does not pickle."""
    import cloudpickle

    try:
        return cloudpickle.loads(dumps_env(env))
    except Exception:
        return None


def _close(env: Any) -> None:
    try:
        env.close()
    except Exception:
        pass


PROBE_STEPS = 1
"""Steps :func:`travels_with_state` takes before the copy (so its state is past the reset) and after
it (compared), on the probe env that is closed afterwards: one each, so an env whose step is
slow (a remote simulator) costs two steps at start, and test envs that fault at a later step
do not fault here."""


def travels_with_state(env: Any, seed: int = 0) -> bool:
    """Whether a live env survives a cloudpickle round trip *with its state* (tried once, on
    the probe env after its reset): then a reconfigure moves envs mid-episode instead of
    recreating them. The copy must step exactly as the env does for the same action:
    gymnasium's MuJoCo envs (``EzPickle``) pickle as their constructor's arguments, and a
    copy made mid-episode starts from the initial pose, not the env's; moved that way, an
    episode jumped to another state without a reset (HalfCheetah-v5: observations 5.7 apart,
    found 2026-11-26). Such an env is recreated instead: its episode restarts, as any env's
    that cannot be pickled (an ale-py env whose state :func:`dumps_env` cannot carry whole
    among them). An env that fails here is not movable; its first collect says why."""
    try:
        space = copy_module.deepcopy(env.action_space)
        space.seed(seed)
        actions = [space.sample() for _ in range(2 * PROBE_STEPS)]
        for a in actions[:PROBE_STEPS]:
            out = env.step(a)
            if out[2] or out[3]:
                env.reset(seed=seed + 1)
    except Exception:
        return False
    twin = _copy(env)
    if twin is None:
        return False
    try:
        for a in actions[PROBE_STEPS:]:
            mine, theirs = env.step(a), twin.step(a)
            if not _same(tuple(mine[:4]), tuple(theirs[:4])):
                return False
            if mine[2] or mine[3]:
                break
        return True
    except Exception:  # a copy that cannot step is no copy
        return False
    finally:
        _close(twin)


def _same(a: Any, b: Any) -> bool:
    """Exact equality of two step results (observations nested in dicts and tuples, NaN equal to NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))
