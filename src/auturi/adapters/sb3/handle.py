"""``model.auturi``: the SB3 face's handle (:class:`SB3Handle`) over the shared
:class:`~auturi.adapters.common.FaceHandle`: it ships the weights (and VecNormalize
statistics) before each collect, tells the tuner how much of ``learn()`` is left, logs the
collect to SB3's logger, draws SB3's progress bar where each replay left it
(:meth:`SB3Handle.hold_progress`), and on ``close()`` gives the model back to SB3. It also
forwards the model's VecEnv calls (``env_method``, ``set_attr``, ``get_attr``) to the envs that
train (:class:`_EnvCallGuard`). A little over 400 lines: these are all ``model.auturi``'s."""
from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.common import Collector, FaceHandle, remaining_collects
from auturi.errors import AuturiError, EnvCallError


PATCHED = ("collect_rollouts", "auturi", "_excluded_save_params")
"""What ``wrap_sb3`` sets on the model instance and :meth:`SB3Handle.close` removes (as
``unwrap_sb3`` does); never saved with the model."""


def closed_message(closed_by: str | None) -> str:
    """What ``learn`` says when the executor is closed; ``closed_by``: the exception a collect
    raised when it closed the executor, if one did."""
    fix = ("call model.auturi.close() to make the model plain SB3 again (its weights, buffers and num_timesteps "
           "are kept), then auturi.wrap(model) to collect through Auturi again")
    if closed_by == "KeyboardInterrupt":
        return (f"this model's Auturi executor was closed when a learn() was interrupted (KeyboardInterrupt, Ctrl-C) "
                f"during a collect: its envs stopped mid-step, so its workers ended; {fix} (the envs then start new "
                f"episodes; learn(..., reset_num_timesteps=False) keeps counting)")
    if closed_by is not None:
        return f"this model's Auturi executor was closed when a collect raised {closed_by} (above); {fix}"
    return f"this model's Auturi executor is closed (a worker failed, or it was closed); {fix}"


def _close_dropped(executor: Any, server: Any) -> None:
    """What :meth:`SB3Handle.close` ends, for a model collected without it (see :meth:`SB3Handle.attach`)."""
    try:
        if server is not None:
            server.stop()
    finally:
        executor.close()


_GUARDED_CALLS = ("env_method", "set_attr", "get_attr")


def _own_call(venv: Any, name: str) -> Any:
    """``venv``'s own (class) method ``name``, bound: what a copy of a guarded VecEnv gets."""
    return getattr(type(venv), name).__get__(venv)


class _EnvCallGuard:
    """One of :meth:`SB3Handle.guard_env_calls`'s stand-ins for a VecEnv's ``env_method``,
    ``set_attr`` or ``get_attr``: while the model is wrapped it forwards the call, with SB3's
    signature and ``indices``, to the executor's calls on the envs that train
    (:meth:`~auturi.executor.base.Executor.env_call`). A module-level class, not a closure: the VecEnv still
    pickles (a closure in its ``__dict__`` made ``pickle.dumps(model.env)`` fail); a copy
    (pickle, deepcopy) gets the VecEnv's own method, since no executor runs its envs.

    It holds its handle weakly and stands aside once the handle is gone or its executor
    closed: a model dropped without ``close()`` (a sweep that reuses one VecEnv) left the
    guard on the VecEnv, and the next model's wrap, which reads a ``SubprocVecEnv``'s envs
    through ``set_attr``, was refused."""

    def __init__(self, venv: Any, name: str, handle: Any):
        self.venv, self.name = venv, name
        self.handle = weakref.ref(handle)

    def _active(self) -> bool:
        h = self.handle()
        if h is not None and h._guarded is not None and not getattr(h.executor, "_closed", False):
            return True
        if vars(self.venv).get(self.name) is self:
            del vars(self.venv)[self.name]  # the VecEnv's own method again
        return False

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        venv = self.venv
        if not self._active():
            return getattr(type(venv), self.name)(venv, name, *args, **kwargs)
        if self.name == "env_method" and name == "render":
            # SB3's VecEnv.render: drawing the model's own env changes nothing the learner gets
            return type(venv).env_method(venv, name, *args, **kwargs)
        handle = self.handle()
        executor = handle.executor  # type: ignore[union-attr]  # _active: the handle is alive
        if self.name != "get_attr" and not handle._warned_on_step and executor.last_num_steps > 1 \
                and _from_on_step():
            handle._warned_on_step = True
            call = f"{self.name}({name!r})"
            warnings.warn(f"{call} from a callback's on_step reaches the envs after the whole collect of "
                          f"{executor.last_num_steps} steps per env (auturi.wrap collects a rollout, then replays "
                          f"it to the callbacks), where plain SB3 changes them from the next step: the change "
                          f"takes effect from the next rollout. For plain SB3's data, make such calls in "
                          f"_on_rollout_start or _on_rollout_end, which run between collects",
                          UserWarning, stacklevel=2)
        try:
            return getattr(self, "_" + self.name)(executor, name, *args, **kwargs)
        except EnvCallError as e:
            if isinstance(e.original, AttributeError):
                # as SB3's own envs raise it: VecEnv.has_attr (and scripts) catch AttributeError
                raise AttributeError(str(e)) from e
            raise

    # SB3's signatures (VecEnv.env_method, set_attr, get_attr), the name apart
    @staticmethod
    def _env_method(executor: Any, method_name: str, *method_args: Any, indices: Any = None,
                    **method_kwargs: Any) -> list:
        return executor.env_method(method_name, *method_args, indices=indices, **method_kwargs)

    @staticmethod
    def _set_attr(executor: Any, attr_name: str, value: Any, indices: Any = None) -> None:
        executor.set_attr(attr_name, value, indices=indices)

    @staticmethod
    def _get_attr(executor: Any, attr_name: str, indices: Any = None) -> list:
        return executor.get_attr(attr_name, indices=indices)

    def __reduce__(self) -> tuple:
        return (_own_call, (self.venv, self.name))


class _SeedGuard(_EnvCallGuard):
    """The stand-in for the VecEnv's ``seed`` while the model is wrapped: SB3's own (the
    VecEnv keeps its pending seeds) and a warning. The envs that train were seeded at the
    wrap (env ``i``: the handle's ``seed + i``, the VecEnv's pending seeds taken first); a
    reseed afterwards (``model.set_random_seed(s)``, ``model.get_env().seed(s)``) reached
    only the VecEnv nothing steps, with no sign of it (2026-11-27)."""

    def __call__(self, seed: Any = None) -> Any:  # type: ignore[override]
        venv = self.venv
        out = type(venv).seed(venv, seed)
        handle = self.handle()
        if self._active() and handle is not None:
            warnings.warn(f"{type(venv).__name__}.seed({seed!r}) after auturi.wrap does not reseed the envs that "
                          f"train: they were seeded at the wrap (env i with {handle.seed} + i). To train from other "
                          f"seeds: model.auturi.close(), reseed, then auturi.wrap(model) again (or "
                          f"auturi.wrap(model, seed=...)).", UserWarning, stacklevel=2)
        return out


def _from_on_step() -> bool:
    """Whether the running call comes from a callback's ``on_step`` (SB3's
    ``BaseCallback.on_step`` is on the stack): the replay of a collect that already ran."""
    callbacks = sys.modules.get("stable_baselines3.common.callbacks")
    code = getattr(getattr(getattr(callbacks, "BaseCallback", None), "on_step", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


class SB3Handle(FaceHandle):
    """What :func:`~auturi.adapters.sb3.wrap_sb3` attaches to the model as ``model.auturi``:
    the executor, the optional online tuner and the last rollout's stats. ``close()`` ends
    the workers and gives the model back SB3's own loop (:meth:`close`)."""

    def __init__(self, collector: Collector, adapter: Any, vecnorm: Any, source_env: Any, seed: int,
                 raw_observation_space: gym.Space, model: Any = None):
        super().__init__(collector, seed)
        # The model this is model.auturi of (a weak reference: the model holds this handle).
        self._model: weakref.ref | None = None
        self._finalizer: weakref.finalize | None = None  # ends the executor when the model is collected (attach)
        if model is not None:
            self.attach(model)
        self._bars: tuple[Any, list[Any]] = (None, [])  # (callback, the progress bars in it); see show_progress
        self.adapter = adapter
        self.vecnorm = vecnorm
        self.source_env = source_env
        self.raw_observation_space = raw_observation_space
        self.cut_episodes = 0  # episodes a reconfigure cut short (see on_policy.restart_cut_episodes)
        self._locked_logged = False
        self._published: tuple | None = None  # the token of the last published state (see collect)
        self._tuner_log: tuple[tuple, dict[str, Any]] = ((), {})  # (tuner key, its records)
        self._config_log: tuple[Any, str] = (None, "")  # (config, its text)
        self.exploration: Any = None  # the off-policy replay's cached exploration state (off_policy._Exploration)
        self.closed_by: str | None = None  # what ended the executor inside a collect (see collect)
        self._warned_on_step = False  # an env call from on_step was told it lands a rollout later (_EnvCallGuard)
        self._guarded: tuple[Any, dict[str, Any]] | None = None  # (VecEnv, its own calls) (see guard_env_calls)
        self.nan_checks: list[tuple[Any, bool]] = []  # VecCheckNan wrappers the replay runs (recover.nan_checks)
        self.wrap_seconds: dict[str, float] = {}  # where the wrap's seconds went (wrap.wrap_seconds)

    def __reduce__(self) -> tuple:
        # Pickling a wrapped model reached the executor's semaphores ("Semaphore objects should
        # only be shared between processes through inheritance"): say what to do instead.
        raise TypeError("a model wrapped by auturi.wrap cannot be pickled: model.auturi holds worker processes and "
                        "shared memory. model.save(path) leaves them out (PPO.load gives a plain SB3 model); or call "
                        "model.auturi.close() first")

    def attach(self, model: Any) -> None:
        """Name the model this handle is ``model.auturi`` of, for :meth:`close`, and close
        when the model is collected without ``close()`` (a sweep that drops each trial's model).

        The model sits in a reference cycle (its ``collect_rollouts`` is a method bound to it),
        so the handle, the executor and its shared-memory blocks were cyclic garbage together,
        finalised in no set order: the executor's ``__del__`` wrote its closing flag into a
        control block already unmapped and the process died (a segfault in ``gc.collect()``,
        2026-11-26). The finalizer holds the executor (and the status server), so they are not
        garbage: they are closed whole, before anything of theirs is freed. It does not hold
        this handle, which holds the last learn's callbacks, and they the model."""
        self._model = weakref.ref(model)
        if self._finalizer is None:
            self._finalizer = weakref.finalize(model, _close_dropped, self.executor, self.server)

    def close(self) -> None:
        """End the workers (and the status server) and give the model back SB3's own
        ``collect_rollouts`` (as :func:`~auturi.adapters.sb3.unwrap_sb3`): it is a plain SB3
        model again, which ``learn`` trains as SB3 does and ``auturi.wrap`` can wrap again.
        ``model.auturi`` is gone after it (keep a reference to read the tuner's result).
        Idempotent."""
        ref, self._model = self._model, None
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()  # closed now: the model's collection has nothing left to close
        try:
            self._unguard_env_calls()
            super().close()
        finally:
            model = ref() if ref is not None else None
            if model is not None and vars(model).get("auturi") is self:
                for name in PATCHED:  # what unwrap_sb3 removes (wrap.py imports this module: no call back)
                    vars(model).pop(name, None)
                if self.collects:
                    # The last observation is the executor's envs', which end here; SB3's next
                    # learn() (even with reset_num_timesteps=False) resets the model's own env
                    # rather than pair that observation with another env's step.
                    model._last_obs = None

    def state(self, model: Any) -> dict[str, np.ndarray]:
        return self.adapter.state_of(model, self.vecnorm)

    def collect(self, model: Any, num_steps: int, extra_state: dict[str, np.ndarray] | None = None,
                extra_key: Any = None, measure: bool = True) -> Any:
        """Publish the weights (plus ``extra_state``: per-collect exploration settings) unless
        nothing of them changed since the last publish, collect ``num_steps`` per env and log it.
        ``extra_key``: a summary of ``extra_state`` that is equal between two calls only when
        ``extra_state`` is (the caller's, cheaper than reading the arrays); ``None``: read them.
        ``measure``: False for an off-policy warm-up collect (random actions, no policy), which
        the online tuner must not time as the training's."""
        if self._model is None:  # a handle made without model= (see attach)
            self.attach(model)
        if getattr(self.executor, "_closed", False):  # the executor's own message says "make a new one"
            raise AuturiError(closed_message(self.closed_by))
        follow = getattr(self.adapter, "follow", None)
        if follow is not None:
            follow(model.policy)
        token = self._publish_token(model, extra_state, extra_key)
        if token is None or token != self._published:
            state = self.state(model)
            if extra_state:
                state.update(extra_state)
            self.executor.set_policy_state(state)
            # The replay normalises the observations with self.adapter's statistics: they must be
            # the ones the replicas act with in this rollout. The executor loads the state into
            # this object only when the layout runs the policy in this process; with replicas
            # elsewhere (two actors, policy workers) it kept the statistics of wrap time, and the
            # buffer got observations normalised otherwise than the policy had seen them.
            self.adapter.load_obs_stats(state)
            self._published = token
        left = int(getattr(model, "_total_timesteps", 0) or 0) - int(model.num_timesteps)
        # What is left of learn(): the online tuner moves only where the move pays back within it.
        try:
            rollout = self.collect_rollout(num_steps, remaining_collects(left, num_steps * self.executor.num_envs),
                                           measure)
        except BaseException as exc:
            # A collect that raises ends the executor (its envs stopped mid-step); the next
            # learn() says why, a Ctrl-C included, rather than "a worker failed, or it was closed".
            if getattr(self.executor, "_closed", False) and self.closed_by is None:
                self.closed_by = type(exc).__name__
            if any(w.raise_exception for w, _ in self.nan_checks) and "check_finite is on" in str(exc):
                # The executor's check stands in for VecCheckNan's (see wrap_sb3): raised as
                # VecCheckNan raises (a ValueError a script may catch), naming the user's wrapper
                # rather than the executor's make_executor(check_finite=) it does not call.
                raise ValueError(f"VecCheckNan(raise_exception=True) around the model's env: {exc}\n(auturi.wrap "
                                 f"checks each env step for it, in the collect; without VecCheckNan, or with "
                                 f"raise_exception=False, the values are stored as they are)") from exc
            raise
        self._log(model, rollout)
        return rollout

    def guard_env_calls(self, venv: Any) -> None:
        """Stand between the user and ``venv``'s (the model's VecEnv, its VecEnv wrappers
        removed) ``env_method``, ``set_attr`` and ``get_attr`` while the model is wrapped.

        The envs that train are Auturi's copies (in its workers, or in this process); ``venv``
        is never stepped. A curriculum callback's ``self.training_env.env_method("set_level",
        k)`` (or ``set_attr``) changed only ``venv``'s envs: the learner went on training at
        the old level with no sign of it (2026-11-26). The calls are forwarded to the
        executor's (:meth:`~auturi.executor.base.Executor.env_call`), which runs them on the
        envs that train, with SB3's ``indices``, between collects (callbacks run between
        them); what they change travels with the envs through the tuner's reconfigures. An
        env's exception comes back as the executor's ``EnvCallError`` (an ``AttributeError``
        when the env raised one, as ``VecEnv.has_attr`` expects). ``env_method("render")``
        (SB3's ``VecEnv.render``) stays on ``venv``: drawing an env nothing trains on changes
        nothing. :meth:`close` puts the VecEnv's own calls back (the envs that trained end
        with the executor; ``venv``'s envs are as they were before the wrap)."""
        own = {name: vars(venv).get(name) for name in (*_GUARDED_CALLS, "seed")}
        own = {k: None if isinstance(v, _EnvCallGuard) else v for k, v in own.items()}  # another model's, stale
        for name in _GUARDED_CALLS:
            setattr(venv, name, _EnvCallGuard(venv, name, self))
        venv.seed = _SeedGuard(venv, "seed", self)
        self._guarded = (venv, own)

    def _unguard_env_calls(self) -> None:
        guarded, self._guarded = self._guarded, None
        if guarded is None:
            return
        venv, own = guarded
        for name, value in own.items():
            if value is None:
                vars(venv).pop(name, None)
            else:
                setattr(venv, name, value)

    def _publish_token(self, model: Any, extra_state: dict[str, np.ndarray] | None, extra_key: Any = None
                       ) -> tuple | None:
        """What the published state is made of, cheaply: equal tokens mean an equal state, so
        the publish (a copy into shared memory, a version every replica reloads) can be
        skipped: TD3 moves its actor every second update, nothing moves before
        ``learning_starts``. ``None`` (always publish): VecNormalize statistics, which move
        every step, or an adapter without :meth:`weights_token`."""
        if self.vecnorm is not None or not hasattr(self.adapter, "weights_token"):
            return None
        if extra_key is not None:
            return self.adapter.weights_token(model), "key", extra_key
        extra = tuple((k, v.dtype.str, v.shape, v.tobytes())
                      for k, v in sorted((k, np.asarray(v)) for k, v in (extra_state or {}).items()))
        return self.adapter.weights_token(model), "state", extra

    def _log(self, model: Any, rollout: Any) -> None:
        log = model.logger
        st = rollout.stats
        log.record("auturi/steps_per_second", float(st.steps_per_second))
        log.record("auturi/collect_seconds", float(st.seconds))
        config = self.executor.config
        if self._config_log[0] is not config:  # str(config) each collect cost ~10 us
            self._config_log = (config, str(config))
        log.record("auturi/config", self._config_log[1], exclude=("tensorboard",))
        log.record("auturi/reconfigure_seconds", float(self.executor.last_reconfigure_seconds))
        for key, (value, exclude) in self._tuner_records(model).items():
            log.record(key, value, exclude=exclude)

    def _tuner_records(self, model: Any) -> dict[str, tuple[Any, Any]]:
        """The tuner's records, rebuilt only when its phase, trials or choice changed: its
        ``result()`` builds a whole report (~200 us, every 1-step collect of a locked run)."""
        t = self.tuner
        if t is None:
            return {}
        locked = t.locked
        # A trial's estimate is the median of its samples, which only grow (an estimate read
        # costs ~15 us: not in the key).
        key = (t.phase, id(locked), tuple((id(tr), tr.status, len(tr.samples)) for tr in t.history))
        if key == self._tuner_log[0]:
            return self._tuner_log[1]
        best = t.best()
        out: dict[str, tuple[Any, Any]] = {"auturi/tuner_phase": (t.phase, ("tensorboard",)),
                                           "auturi/tuner_trials": (len(t.history), None)}
        if best is not None:
            out["auturi/best_steps_per_second"] = (float(best.estimate), None)
        if locked is not None:
            res = t.result()
            out["auturi/choice"] = (str(res.choice), ("tensorboard",))
            for versus in ("start", "serial"):
                gain = res.speedup(versus)
                if np.isfinite(gain):
                    out[f"auturi/speedup_vs_{versus}"] = (float(gain), None)
            if not self._locked_logged and model.verbose >= 1:
                print(f"auturi: locked in {res.choice} ({res.reason})")
            self._locked_logged = True
        self._tuner_log = (key, out)
        return out

    def hold_progress(self, callback: Any, seconds: float) -> list[tuple[Any, float, float]]:
        """Before the replay of a collect that lasted ``seconds``: keep SB3's progress bar
        (``learn(..., progress_bar=True)``) from drawing during the replay's burst of
        ``on_step`` calls; :meth:`show_progress` draws it at the count the replay reached.

        The replay advances the bar by ``n_envs`` per step, as SB3's loop does, but all at once
        after the collect, and the bar (tqdm) draws at most every ``mininterval`` (0.1 s): it
        drew the first replayed step, then nothing until the next collect's, so it sat at
        ``k * rollout + n_envs`` (``8/1,000,000`` for the first 30 s of a default PPO run,
        2026-11-26); and a draw within the replay times steps over the replay's milliseconds
        (a rate of 10^5 it/s). Held, the bar draws once per collect, its rate over the time
        since its last draw. A collect shorter than ``mininterval`` is left to the bar
        itself (off-policy, one step per collect)."""
        cached, bars = self._bars
        if cached is not callback:  # one CallbackList per learn(): searched once per learn
            bars = [b for b in _progress_bars(callback) if getattr(b, "pbar", None) is not None]
            self._bars = (callback, bars)
        held = []
        for bar in bars:
            pbar = bar.pbar
            interval = getattr(pbar, "mininterval", None)
            if interval is not None and seconds >= interval and hasattr(pbar, "last_print_t"):
                held.append((pbar, pbar.last_print_t, interval))
                pbar.mininterval = float("inf")  # no draw until show_progress (training's end draws anyway)
        return held

    def show_progress(self, held: list[tuple[Any, float, float]]) -> None:
        """After the replay: draw each bar :meth:`hold_progress` held at its count now."""
        for pbar, drawn_at, interval in held:
            pbar.mininterval = interval
            pbar.last_print_t = drawn_at  # the monitor thread's forced redraws do not move it
            _redraw(pbar)


def _progress_bars(callback: Any) -> Any:
    """SB3's ``ProgressBarCallback`` objects in ``callback`` (a ``CallbackList`` and the
    child callbacks of event callbacks included)."""
    from stable_baselines3.common.callbacks import ProgressBarCallback

    todo, seen = [callback], set()
    while todo:
        cb = todo.pop()
        if cb is None or id(cb) in seen:
            continue
        seen.add(id(cb))
        if isinstance(cb, ProgressBarCallback):
            yield cb
        todo.extend(getattr(cb, "callbacks", None) or ())
        todo.append(getattr(cb, "callback", None))


def _redraw(pbar: Any) -> None:
    """Draw ``pbar`` (a tqdm bar) at its count now, as its own ``update`` does when it draws
    (the rate's moving average and the last drawn count included)."""
    if getattr(pbar, "disable", False) or pbar.n == getattr(pbar, "last_print_n", None):
        return
    try:
        now = pbar._time()
        dn, dt = pbar.n - pbar.last_print_n, now - pbar.last_print_t
        if pbar.smoothing and dt > 0 and dn:
            pbar._ema_dn(dn)
            pbar._ema_dt(dt)
        pbar.refresh(lock_args=pbar.lock_args)
        pbar.last_print_n, pbar.last_print_t = pbar.n, now
    except AttributeError:  # a tqdm without these internals: a plain redraw
        pbar.refresh()
