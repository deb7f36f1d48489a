"""``auturi.tune(env, ...)``: what ``auturi tune ENV`` does, from Python.

It probes the env's spaces, builds a policy for them (or takes yours), measures layouts on an
executor with the offline :class:`~auturi.tuner.Tuner`, and returns a :class:`TuneReport` (a
:class:`~auturi.tuner.TuneResult`) whose ``config`` goes straight into
``auturi.wrap(model, config=result.config)``. The command line is built on it.

It also says why the choice wins: every collect's :class:`~auturi.CollectStats` is kept by
config, so each finalist's time splits into env stepping, inference, waiting and the rest
(IPC and bookkeeping), and the serial config's stats give this machine's limit for the
workload (:func:`machine_limit`: the cores over what each step needs of them, env stepping
and the best inference device's CPU share, capped by that device's batched throughput; a
GPU's forward passes take the cores only their host side).

Over 400 lines: ``tune`` and the explanation it returns (the time splits, the limit, the
report type) are one module because the report is built from the run's collects; the
env and policy helpers at the top are the part to split out next.

Example:
    >>> import auturi, gymnasium as gym
    >>> from auturi.envs import CountingEnv
    >>> result = auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=4, num_steps=8,
    ...                      budget_trials=2, backend="serial", cache=False)
    >>> isinstance(result.config, auturi.Config), result.config.num_envs
    (True, 4)
    >>> sorted(result.split(result.config))
    ['env', 'inference', 'ipc', 'waiting']
"""
from __future__ import annotations

import functools
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from auturi.config import Config
from auturi.tuner.offline import Tuner
from auturi.tuner.result import Callback, TuneResult
from auturi.tuner.space import serial_baseline

__all__ = ["TuneReport", "builtin_policy", "machine_limit", "probe_spaces", "time_split", "trial_bound", "tune"]

SPLIT_PARTS = ("env", "inference", "waiting", "ipc")
"""The parts of a collect's time (see :func:`time_split`)."""


# ---------------------------------------------------------------------------- env and policy
def probe_spaces(env: Any) -> tuple[Any, Any]:
    """Observation and action space of one env of ``env`` (an id, a factory or a list of
    them; made and closed here). Raises ``ValueError``/``TypeError`` naming the problem."""
    import gymnasium as gym

    from auturi.envs import resolve_env_fns

    fn = resolve_env_fns(env, None if isinstance(env, (list, tuple)) else 1)[0]  # a list: its first factory
    try:
        e = fn()
    except Exception as exc:  # noqa: BLE001 - the user's factory: say what it raised, in one line
        raise ValueError(f"making the env failed: {type(exc).__name__}: {exc}") from exc
    try:
        if not isinstance(e, gym.Env):
            raise TypeError(f"the env factory returned a {type(e).__name__}, not a gymnasium.Env")
        return e.observation_space, e.action_space
    finally:
        try:
            e.close()
        except Exception:  # noqa: BLE001, S110 - closing a probe env must not hide its spaces
            pass


def builtin_policy(kind: str, obs_space: Any, action_space: Any, *, option: str = "policy=",
                   other: str = "a Policy object") -> tuple[Any, str]:
    """A built-in torch policy for the spaces: ``auto`` (``cnn`` for channels-first 84x84
    frames with discrete actions, else ``mlp``), ``mlp`` (64x64) or ``cnn`` (Nature CNN).
    Returns it and a description; raises ``ValueError`` naming the fix for spaces it cannot
    serve (``option`` and ``other`` word it for the caller: the CLI says ``--policy``).

    >>> import gymnasium as gym
    >>> builtin_policy("cnn", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    Traceback (most recent call last):
    ...
    ValueError: policy=cnn needs channels-first 84x84 frames (C, 84, 84); this env gives (4,): use policy=mlp
    """
    import gymnasium as gym
    import numpy as np

    kind = kind.strip().lower()
    if kind not in ("auto", "mlp", "cnn"):
        raise ValueError(f"{option}{kind!r}: use mlp, cnn, auto or {other}")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise ValueError(f"the built-in policies support Discrete and Box action spaces, not {action_space}; "
                         f"pass {other}")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"the built-in policies need a Box observation space, not {type(obs_space).__name__}; "
                         f"pass {other}")
    image = len(obs_space.shape) == 3 and obs_space.shape[1:] == (84, 84)
    if kind == "auto":
        kind = "cnn" if image and isinstance(action_space, gym.spaces.Discrete) else "mlp"
    if kind == "cnn" and not image:
        raise ValueError(f"{option}cnn needs channels-first 84x84 frames (C, 84, 84); this env gives "
                         f"{obs_space.shape}: use {option}mlp")
    if kind == "cnn" and not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{option}cnn needs a Discrete action space; use {option}mlp")
    from auturi.nets import MLPActorCritic, NatureCNNActorCritic  # imports torch: after the checks
    from auturi.policy import TorchPolicy

    if kind == "cnn":
        fn = functools.partial(NatureCNNActorCritic, int(obs_space.shape[0]), int(action_space.n))
        return TorchPolicy(fn, action_space), "cnn (Nature CNN)"
    obs_dim = int(np.prod(obs_space.shape))
    if isinstance(action_space, gym.spaces.Discrete):
        fn = functools.partial(MLPActorCritic, obs_dim, int(action_space.n))
    else:
        fn = functools.partial(MLPActorCritic, obs_dim, int(np.prod(action_space.shape)), continuous=True)
    return TorchPolicy(fn, action_space), "mlp (64x64)"


# ---------------------------------------------------------------------------- why a layout wins
class _StatsRecorder:
    """The executor as the tuner sees it, keeping every collect's ``CollectStats`` under the
    config it ran in. Everything else goes to the executor itself; the tuner only calls the
    executor contract, so this changes nothing it measures."""

    def __init__(self, executor: Any):
        self._executor = executor
        self.stats: dict[Config, list[Any]] = {}

    def collect(self, num_steps: int) -> Any:
        rollout = self._executor.collect(num_steps)
        stats = getattr(rollout, "stats", None)
        if stats is not None:
            self.stats.setdefault(self._executor.config, []).append(stats)
        return rollout

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


def time_split(stats: list[Any], num_actors: int) -> dict[str, float]:
    """Where a config's collect time goes, as shares summing to 1: ``env`` (stepping envs),
    ``inference``, ``waiting`` (an actor blocked on a worker) and ``ipc`` (the rest of the
    actors' wall time: hand-offs between processes and bookkeeping). The stats sum each part
    over actors, so the parts are shares of the actors' summed time; with env workers running
    in parallel the busy parts can exceed it, and ``ipc`` is then 0.

    >>> from auturi import CollectStats
    >>> time_split([CollectStats(steps=10, seconds=1.0, env_seconds=0.5, policy_seconds=0.3)], 1)
    {'env': 0.5, 'inference': 0.3, 'waiting': 0.0, 'ipc': 0.2}
    """
    env = sum(s.env_seconds for s in stats)
    inference = sum(s.policy_seconds for s in stats)
    waiting = sum(s.wait_seconds for s in stats)
    wall = sum(s.seconds for s in stats) * max(1, num_actors)
    ipc = max(0.0, wall - env - inference - waiting)
    total = max(wall, env + inference + waiting)
    if total <= 0:
        return {k: 0.0 for k in SPLIT_PARTS}
    return {k: round(v / total, 4) for k, v in zip(SPLIT_PARTS, (env, inference, waiting, ipc))}


def machine_limit(serial_stats: list[Any], cores: int, profile: dict[str, Any] | None = None,
                  num_envs: int | None = None, loaded_step_factor: float | None = None,
                  serial_device: str = "cpu") -> dict[str, Any]:
    """This machine's estimated ceiling for the workload, in steps/s, from the serial
    config's collects (envs and policy in the caller, no IPC) and the model strategy's
    profile when there is one. What needs the cores (env stepping with the loop's
    bookkeeping, CPU inference, the host side of a GPU's forward passes) is kept apart from
    what a GPU does, so on a GPU machine the cores are not charged for CUDA inference.

    For each inference device the profile timed (else ``serial_device``, where the serial
    collects ran their policy), the least of:

    - ``cpu_steps_per_second``: ``cores / (env CPU + that device's CPU per step)``. The env's
      CPU is the serial collects' env time per step times the profile's ``env_cpu_fraction``
      (a remote simulator that waits uses little); inference's is the cheapest per-row CPU
      time of any batch size profiled on that device: all of a CPU forward pass, only the
      launching and copying of a GPU's (the profile's ``policy_cpu_seconds``; a tenth of the
      wall time where it has none);
    - ``concurrent_steps_per_second`` (with ``num_envs``): every env stepping back to back
      in a process of its own, the ceiling of an env that waits rather than computes;
    - ``inference_steps_per_second``: that device's best batched inference throughput (the
      profile's latencies by batch size, else the serial collects' batch of all envs);

    and the limit is the best device's (``inference_device``). ``env_steps_per_second`` is
    what the envs alone allow (the least of the first two without inference's CPU);
    ``inference_cpu_seconds`` is the chosen device's CPU per step; ``bound`` is
    ``"inference"`` where inference's throughput binds or uses more of the cores than the
    envs, else ``"env"``.

    Where the profile measured the env with every core busy (its ``env_loaded_step_seconds``,
    ``auturi tune`` on 4 cores or more: :mod:`auturi.executor.loaded`), the env's CPU per step is
    the loaded one, stretched by the profile's measured ``loaded_step_factor``, and
    ``env_loaded`` is ``"measured"``: on the H200 box of 2026-11-27 one env alone stepped 1.28x
    faster than each of 16 busy vCPUs, and the limit without it said 19,633 steps/s where the
    envs alone stepped 15,314. Otherwise all of it assumes the cores scale perfectly (each
    steps as fast as one env alone); with the model's fitted ``loaded_step_factor`` above 1,
    ``loaded_env_steps_per_second`` is the envs-only rate at that speed (None otherwise) and
    ``env_loaded`` is ``"fitted"``: on the GPU box of 2026-11-26 the fit said 1.8, so 16,100
    steps/s where perfect scaling says 28,943.

    >>> from auturi import CollectStats
    >>> s = [CollectStats(steps=100, seconds=0.1, env_seconds=0.05, policy_seconds=0.02)]
    >>> lim = machine_limit(s, cores=2)   # 500 us env + 200 us inference per step on 2 cores
    >>> lim["steps_per_second"], lim["env_steps_per_second"], lim["bound"]
    (2857.1, 4000.0, 'env')
    >>> waits = {"env_cpu_fraction": 0.05}   # the env's 500 us are mostly waiting
    >>> machine_limit(s, cores=2, profile=waits, num_envs=4)["steps_per_second"]   # 4 envs at once
    5000.0
    >>> gpu = {"policy_seconds": {"cpu": {"8": 0.004}, "cuda": {"8": 0.0008}},
    ...        "policy_cpu_seconds": {"cpu": {"8": 0.004}, "cuda": {"8": 0.0008}}}
    >>> lim = machine_limit(s, cores=2, profile=gpu)   # CUDA: 100 us of host CPU a step, not 500
    >>> lim["steps_per_second"], lim["inference_device"]
    (3333.3, 'cuda')
    >>> machine_limit(s, cores=2, serial_device="cuda")["inference_device"]   # serial's passes ran on cuda
    'cuda'
    >>> busy = {"env_loaded_step_seconds": 0.000625, "loaded_step_factor": 1.25}   # measured on every core
    >>> lim = machine_limit(s, cores=2, profile=busy)   # 625 us env + 200 us inference per step
    >>> lim["steps_per_second"], lim["env_steps_per_second"], lim["env_loaded"]
    (2424.2, 3200.0, 'measured')
    """
    prof = profile or {}
    steps = sum(s.steps for s in serial_stats)
    env_s = sum(s.env_seconds for s in serial_stats)
    pol_s = sum(s.policy_seconds for s in serial_stats)
    if steps <= 0:
        return {"steps_per_second": None, "env_steps_per_second": None, "inference_steps_per_second": None,
                "cpu_steps_per_second": None, "concurrent_steps_per_second": None, "cores": cores, "bound": "env",
                "inference_device": None, "inference_cpu_seconds": None, "loaded_env_steps_per_second": None,
                "env_loaded": None}
    t_env, t_pol = env_s / steps, pol_s / steps
    frac = prof.get("env_cpu_fraction")
    frac = min(1.0, max(0.0, float(frac))) if isinstance(frac, (int, float)) else 1.0
    env_cpu = t_env * frac
    loaded_step = prof.get("env_loaded_step_seconds")
    factor = prof.get("loaded_step_factor")
    measured = isinstance(loaded_step, (int, float)) and loaded_step > 0 and isinstance(factor, (int, float))
    if measured:  # what each busy core steps, measured: the limit's envs are the loaded ones
        env_cpu *= max(1.0, float(factor))
        loaded_step_factor = None
    env_alone = cores / env_cpu if env_cpu > 0 else math.inf
    concurrent = num_envs / t_env if num_envs and t_env > 0 else math.inf
    # Per device: (inference throughput, CPU seconds per step). The serial collects ran the
    # policy on serial_device: their time per step is the fallback for it (all of it CPU time
    # on the CPU, a tenth on a device: its launches and copies).
    serial_on_cpu = str(serial_device).split(":")[0] == "cpu"
    devices: dict[str, tuple[float, float]] = {
        "cpu" if serial_on_cpu else str(serial_device):
        (1.0 / t_pol if t_pol > 0 else math.inf, t_pol if serial_on_cpu else 0.1 * t_pol)}
    for dev, table in (prof.get("policy_seconds") or {}).items():
        rates = [int(b) / float(t) for b, t in table.items() if float(t) > 0]
        cpu_table = (prof.get("policy_cpu_seconds") or {}).get(dev)
        on_cpu = str(dev).split(":")[0] == "cpu"
        if cpu_table:
            per_row = [float(t) / int(b) for b, t in cpu_table.items() if float(t) > 0]
        else:  # untimed: all of a CPU pass, a tenth of a device's (its launches)
            per_row = [float(t) / int(b) * (1.0 if on_cpu else 0.1) for b, t in table.items() if float(t) > 0]
        best_rate = max(rates) if rates else math.inf
        cpu_pol = min(per_row) if per_row else (t_pol if on_cpu else 0.0)
        if on_cpu and "cpu" in devices:
            old_rate, _ = devices["cpu"]
            best_rate = max(best_rate, old_rate) if math.isfinite(old_rate) else best_rate
        devices["cpu" if on_cpu else str(dev)] = (best_rate, cpu_pol)

    def rate(dev: str) -> float:
        inference, cpu_pol = devices[dev]
        cpu = cores / (env_cpu + cpu_pol) if env_cpu + cpu_pol > 0 else math.inf
        return min(cpu, concurrent, inference)

    dev = max(devices, key=rate)  # dicts keep order: the CPU wins ties
    inference, cpu_pol = devices[dev]
    cpu = cores / (env_cpu + cpu_pol) if env_cpu + cpu_pol > 0 else math.inf
    limit = min(cpu, concurrent, inference)

    def num(x: float) -> float | None:
        return round(x, 1) if math.isfinite(x) else None

    # Which cost binds: inference's throughput, envs that cannot step faster however many
    # run at once, or the shared cores, split by whichever of the two uses more of them.
    if limit == inference:
        bound = "inference"
    elif limit == concurrent:
        bound = "env"
    else:
        bound = "env" if env_cpu >= cpu_pol else "inference"
    return {"steps_per_second": num(limit), "env_steps_per_second": num(min(env_alone, concurrent)),
            "inference_steps_per_second": num(inference), "cpu_steps_per_second": num(cpu),
            "concurrent_steps_per_second": num(concurrent), "cores": cores, "bound": bound,
            "inference_device": dev, "inference_cpu_seconds": cpu_pol if math.isfinite(cpu_pol) else None,
            "loaded_env_steps_per_second": num(min(env_alone, concurrent)) if measured
            else num(min(env_alone / loaded_step_factor, concurrent))
            if loaded_step_factor and loaded_step_factor > 1.0 else None,
            "env_loaded": "measured" if measured else "fitted" if loaded_step_factor and loaded_step_factor > 1.0
            else None}


@dataclass
class TuneReport(TuneResult):
    """A :class:`~auturi.tuner.TuneResult` that also says why the choice wins.

    ``splits``: for each finalist (the configs re-measured after the search, else every
    measured config), its label and :func:`time_split`; ``limit``: :func:`machine_limit`.
    Both are in the JSON record under ``"explain"``.

    >>> from auturi import Config
    >>> r = TuneReport(choice=Config.serial(2), reason="", trials=[], final=[], start=Config.serial(2),
    ...                num_steps=4, splits=[{"config": Config.serial(2).to_dict(), "label": "serial",
    ...                                      "split": {"env": 0.6, "inference": 0.3, "waiting": 0.0, "ipc": 0.1}}])
    >>> r.split(r.config)["env"]
    0.6
    """

    splits: list[dict[str, Any]] = field(default_factory=list)
    limit: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> Config:
        """The choice, ready for ``auturi.wrap(model, config=result.config)``."""
        return self.choice

    def split(self, config: Config) -> dict[str, float] | None:
        """:func:`time_split` of ``config`` when it was measured, else None."""
        for s in self.splits:
            if s["config"] == config.to_dict():
                return s["split"]
        return None

    def limit_share(self) -> float | None:
        """The choice's throughput over :attr:`limit` (0.78: 78% of what this machine can
        step for this workload), or None when either is unknown."""
        top = self.limit.get("steps_per_second")
        return self.throughput / top if top and math.isfinite(self.throughput) else None

    def to_record(self) -> dict[str, Any]:
        rec = super().to_record()
        rec["explain"] = {"splits": self.splits, "limit": self.limit, "limit_share": self.limit_share()}
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TuneReport:
        base = TuneResult.from_record(rec)
        explain = rec.get("explain") or {}
        return cls(**{f: getattr(base, f) for f in base.__dataclass_fields__},
                   splits=list(explain.get("splits") or []), limit=dict(explain.get("limit") or {}))


def _explain(result: TuneResult, recorder: _StatsRecorder) -> TuneReport:
    finalists = list(dict.fromkeys(t.config for t in result.final)) or \
        list(dict.fromkeys(t.config for t in result.trials))
    splits = [{"config": c.to_dict(), "label": str(c), "split": time_split(recorder.stats[c], c.num_actors)}
              for c in finalists if recorder.stats.get(c)]
    serial = serial_baseline(result.start)
    cores = int((result.hardware or {}).get("cores") or os.cpu_count() or 1)
    profile = (result.strategy or {}).get("profile")
    # The model strategy's fit (the record's "fitted": what its measurements said the
    # unmeasurable costs are), for the envs-only rate with every core busy.
    factor = ((result.strategy or {}).get("fitted") or {}).get("loaded_step_factor")
    limit = machine_limit(recorder.stats.get(serial, []), cores, profile if isinstance(profile, dict) else None,
                          num_envs=result.start.num_envs,
                          loaded_step_factor=float(factor) if isinstance(factor, (int, float)) else None,
                          serial_device=serial.policy_device)
    return TuneReport(**{f: getattr(result, f) for f in result.__dataclass_fields__}, splits=splits, limit=limit)


# ---------------------------------------------------------------------------- tune
@dataclass
class _Budget:
    trials: int | None
    seconds: float | None


def _whole(name: str, value: Any, low: int, none: str = "") -> int | None:
    """``value`` as an ``int`` when it is a whole number >= ``low`` (numpy's integers too;
    ``True`` is not a count), else ``ValueError`` naming ``name``; ``None`` passes where
    ``none`` says what it means."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}" + (f" (None: {none})" if none else ""))
    return int(value)


def _seconds(name: str, value: Any, none: str = "") -> float | None:
    """``value`` as a finite number of seconds > 0 (``None`` passes where ``none`` says what
    it means), else ``ValueError`` naming ``name``."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}" + (f" (None: {none})" if none else ""))
    return float(value)


def _check_budget(num_envs: int, num_steps: int, budget_trials: int | None, budget_seconds: float | None,
                  max_trial_seconds: float) -> _Budget:
    """The arguments' rules, checked before any heavy import; ``ValueError`` names the fix."""
    _whole("num_envs", num_envs, 1)
    _whole("num_steps", num_steps, 1)
    trials = _whole("budget_trials", budget_trials, 1, none="the strategy's own stop")
    seconds = _seconds("budget_seconds", budget_seconds, none="15 s when budget_trials is None too")
    _seconds("max_trial_seconds", max_trial_seconds)
    if trials is None and seconds is None:
        seconds = DEFAULT_BUDGET_SECONDS
    return _Budget(trials, seconds)


def _check_devices(devices: Any) -> list[str] | None:
    """``devices`` as a list of devices this machine has (``None``: the tuner's default), else
    the error naming the fix: a bare string, an empty list and a missing GPU searched nothing
    (or failed on the first letter) before."""
    if devices is None:
        return None
    if isinstance(devices, str):
        raise TypeError(f"devices must be a list of devices, e.g. ['cpu', 'cuda'], got the str {devices!r} "
                        f"(write [{devices!r}])")
    devices = list(devices)
    if not devices:
        raise ValueError("devices is empty: nothing could run the policy; pass ['cpu'], ['cuda'] or both "
                         "(None: cpu, plus cuda when present)")
    from auturi.resources import check_device

    for d in devices:
        check_device(d, use_cpu="devices=['cpu']")
    return devices


def _check_executor_kwargs(backend: str, kwargs: dict[str, Any]) -> None:
    """``auturi.tune``'s extra keywords go to :func:`auturi.make_executor`: an unknown one is
    named here, before any worker starts (it failed in the executor's constructor after the
    forkservers had started)."""
    from auturi.executor import EXECUTOR_KEYWORDS

    known = EXECUTOR_KEYWORDS["all"] | EXECUTOR_KEYWORDS.get(backend, frozenset())
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"auturi.tune() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; besides "
                        f"its own it takes what make_executor(backend={backend!r}) takes: {', '.join(sorted(known))}")


def _builtin_for(env: Any, kind: str) -> Any:
    """The built-in policy ``kind`` for ``env``'s spaces. An Atari id stays raw here (the CLI
    alone applies the Atari preprocessing by default), so on one the error, or the choice of
    an MLP over 210x160x3 frames, names the factory that gives the frames agents train on."""
    obs_space, action_space = probe_spaces(env)
    atari = isinstance(env, str) and _raw_atari(env)
    hint = (f"{env!r} gives raw {tuple(obs_space.shape)} frames; for the frames Atari agents train on (84x84 grey, 4 "
            f"stacked: what `auturi tune {env}` tunes) pass env=auturi.envs.atari.AtariPreprocessed({env!r})")
    try:
        policy, label = builtin_policy(kind, obs_space, action_space)
    except ValueError as e:
        if atari and "84x84" in str(e):
            raise ValueError(f"policy={kind!r} needs channels-first 84x84 frames: {hint} (or use policy='mlp' on "
                             f"the raw frames)") from None
        raise
    if atari and label.startswith("mlp"):
        import warnings

        warnings.warn(f"policy={kind!r} is an MLP here: {hint}", UserWarning, stacklevel=3)
    return policy


def _raw_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an id ale-py makes (probed, so registered by now)."""
    from auturi.envs.atari import is_ale_id

    try:
        from auturi.envs import find_env_id

        return is_ale_id(find_env_id(env_id)[0])
    except (ValueError, ImportError):
        return False


DEFAULT_BUDGET_SECONDS = 15.0
"""The budget when neither ``budget_trials`` nor ``budget_seconds`` is given."""


def tune(env: Any, *, policy: Any = "auto", num_envs: int = 8, num_steps: int = 64,
         budget_seconds: float | None = None, budget_trials: int | None = None, strategy: str = "model",
         backend: str = "shm", start: Config | None = None, devices: list[str] | None = None, seed: int = 0,
         cores: int | None = None, cache: bool = True, max_trial_seconds: float = 4.0, top_k: int = 2,
         final_rounds: tuple[int, int] = (1, 2), callback: Callback | None = None,
         on_start: Callable[[Tuner, Any], None] | None = None, **executor_kwargs: Any) -> TuneReport:
    """Measure collection layouts for ``env`` on this machine and return the fastest.

    Args:
        env: a gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``, ``"my_pkg:MyEnv-v0"``), an
            EnvPool id (``"envpool:Pong-v5"``), a factory returning a ``gymnasium.Env``, or a
            list of factories. An Atari id gives its raw frames here; ``auturi tune`` tunes
            ``auturi.envs.atari.AtariPreprocessed(id)`` (84x84 grey, 4 stacked), pass that for the same.
        policy: ``"auto"``, ``"mlp"``, ``"cnn"`` (see :func:`builtin_policy`) or a
            :class:`~auturi.Policy` (e.g. your model's, as ``auturi.wrap`` would run it).
        num_envs: total envs (kept fixed: it changes the algorithm).
        num_steps: steps per env per collect (your training's rollout length).
        budget_seconds: wall seconds for the whole tuning (default 15 when no budget is given).
        budget_trials: most configs measured in the search, baselines included.
        strategy: ``"model"`` (profile, predict, measure the promising), ``"grid"``, ``"optuna"``.
        backend: ``"shm"``, ``"serial"`` or ``"ray"`` (``address=`` picks the cluster).
        start: your current layout, measured as a baseline (default: serial, its policy on
            the first GPU among the devices considered, else on the CPU: the loop a GPU user
            runs; on the ``ray`` backend, the CPU). Serial is measured too, its policy on the
            start's device.
        devices: policy devices to consider (default: cpu, plus cuda when present).
        cores: the cores to plan for: the search space's process cap and the model's cores
            (default: the cores this process may run on). Fewer leaves the rest to other work
            on the machine (a learner, another job).
        cache: start from, and store into, the results cache.
        callback: called with every :class:`~auturi.tuner.TunerEvent` (progress).
        on_start: called with the tuner and the executor just before the first measurement.
        executor_kwargs: passed to :func:`auturi.make_executor` (``worker_timeout=``, ``address=``).

    Returns:
        a :class:`TuneReport`: ``result.config`` is the choice, ``result.splits`` and
        ``result.limit`` say why it wins; the executor is closed.

    >>> import auturi
    >>> result = auturi.tune("CartPole-v1", policy="mlp", num_envs=2, num_steps=4, budget_trials=1,
    ...                      backend="serial", cache=False)
    >>> result.config == auturi.Config.serial(2)   # one trial: the start, which is serial
    True

    Then ``auturi.wrap(model, config=result.config)`` (SB3) trains with it.
    """
    budget = _check_budget(num_envs, num_steps, budget_trials, budget_seconds, max_trial_seconds)
    num_envs, num_steps = int(num_envs), int(num_steps)
    cores = _whole("cores", cores, 1, none="the cores this process may run on")
    seed = _whole("seed", seed, 0)
    from auturi.executor import BACKENDS, make_executor, warm_backend

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    _check_executor_kwargs(backend, executor_kwargs)
    devices = _check_devices(devices)
    built_in = isinstance(policy, str)
    # What the backend's workers fork from imports (gymnasium, torch) on another core while
    # this process probes the env and builds the policy (start-up, not tuning).
    wait_ready = warm_backend(backend, policy_processes=built_in)
    if built_in:
        policy = _builtin_for(env, policy)
    # The model's profile also steps the env on every core at once (4 cores or more): the
    # limit line and the model's first predictions then know what busy cores step.
    skw = {"profile_kwargs": {"loaded": True}} if strategy == "model" else None
    tuner = Tuner(strategy, budget_trials=budget.trials, budget_seconds=budget.seconds,
                  max_trial_seconds=max_trial_seconds, top_k=top_k, final_rounds=final_rounds, devices=devices,
                  cores=cores, cache=None if cache else False, callback=callback, seed=seed, strategy_kwargs=skw)
    if start is None and backend != "ray":
        from auturi.tuner.space import available_devices

        gpu = next((d for d in (devices or available_devices()) if str(d).split(":")[0] != "cpu"), None)
        if gpu is not None:  # the loop a GPU user runs: its baselines measure at its speed, not CPU inference's
            start = Config.serial(int(num_envs), gpu)
    with make_executor(env, policy, num_envs, start, backend=backend, seed=seed, **executor_kwargs) as ex:
        wait_ready()  # no such import may share the cores with the first measurement
        if on_start is not None:
            on_start(tuner, ex)
        recorder = _StatsRecorder(ex)
        result = tuner.tune(recorder, num_steps)
    return _explain(result, recorder)


def trial_bound(status: dict[str, Any]) -> int | None:
    """The most trials this run can measure, from a :meth:`Tuner.status` snapshot: the trial
    budget, capped by the space's configs (None when neither is known yet).

    >>> trial_bound({"budget_trials": 10, "space": {"configs": 6}})
    6
    """
    caps = [c for c in (status.get("budget_trials"), (status.get("space") or {}).get("configs")) if c]
    return min(caps) if caps else None
