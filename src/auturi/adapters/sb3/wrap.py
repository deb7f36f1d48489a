"""``auturi.wrap(model)`` for SB3: :func:`wrap_sb3` checks the model, recovers its envs
(:mod:`.recover`), builds the policy adapter (:mod:`.policy`), the executor and the online tuner
(:func:`auturi.adapters.common.build_collector`), and replaces the instance's
``collect_rollouts`` with the on-policy (:mod:`.on_policy`) or off-policy (:mod:`.off_policy`)
replay; :func:`unwrap_sb3` undoes it."""
from __future__ import annotations

import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.common import build_collector, check_face_options, ray_kwargs, resolve_budget, resolve_seed
from auturi.adapters.sb3.envs import ENV_FN_HINT, EnvFactory, EnvRebuildError
from auturi.adapters.sb3.handle import PATCHED, SB3Handle
from auturi.adapters.sb3.policy import DISTRIBUTIONS, SB3PolicyAdapter
from auturi.adapters.sb3.recover import factories_from_vecenv, nan_checks, same_space, split_vec_wrappers
from auturi.config import Config, total_envs_error
from auturi.errors import AuturiError

def _excluded_save_params(self: Any) -> list[str]:
    return [*type(self)._excluded_save_params(self), *PATCHED]


def start_layout(venv: Any, n: int, device: str = "cpu") -> Config:
    """The layout the online search starts from: the one ``venv`` (the model's VecEnv, its
    VecEnv wrappers removed) runs. A ``SubprocVecEnv`` steps each env in a process of its own:
    degree ``n`` (the actor steps one env, ``n - 1`` env workers the others); anything else
    steps them in the caller: serial. The start is the search's baseline, measured first and
    kept unless another layout measures clearly faster: started serial, a ``SubprocVecEnv``
    user's run went back to stepping in one process until the search had measured its way
    out, and an 8-env DQN on a 1 ms env ran its 1,000 warm-up steps serial, 1.5x slower in
    ``learn()`` than the ``SubprocVecEnv`` it replaced.

    ``device``: where the start's policy acts, the model's own device (:func:`model_device`):
    a model on CUDA acted on CUDA in its own loop (started on the CPU, the GPU record's Pong
    run measured its start and serial baselines at CPU inference, 3.3x slower there).

    >>> from stable_baselines3.common.vec_env import DummyVecEnv
    >>> import gymnasium as gym
    >>> start_layout(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 4), 4) == Config.serial(4)
    True
    """
    from stable_baselines3.common.vec_env import SubprocVecEnv

    if isinstance(venv, SubprocVecEnv) and n > 1:
        return Config(num_actors=1, envs_per_actor=n, env_parallel_degree=n, policy_device=device)
    return Config.serial(n, device)


def model_device(model: Any) -> str:
    """``"cuda"`` when ``model``'s policy is on a CUDA device this process counts (training
    stays there; the start's inference runs there too), else ``"cpu"``.

    >>> class M: device = "cpu"
    >>> model_device(M())
    'cpu'
    """
    from auturi.resources import cuda_device_count

    dev = str(getattr(model, "device", "cpu"))
    return "cuda" if dev.startswith("cuda") and cuda_device_count() > 0 else "cpu"


def wrap_sb3(model: Any, *, config: Config | None = None, tune: bool = True, strategy: str = "model",
             budget: Any = None, budget_trials: int | None = None, budget_seconds: float | None = None,
             tuner_options: dict[str, Any] | None = None, backend: str = "shm", status_port: int | None = None,
             env_fn: Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]] | None = None,
             seed: int | None = None, deterministic: bool = False, worker_timeout: float | None = None,
             address: str | None = None, actor_resources: dict[str, float] | None = None) -> Any:
    """Make ``model.learn()`` collect its experience through an Auturi executor.

    Returns the same ``model`` object. ``learn``, ``save``, ``load``, ``predict``, callbacks,
    the progress bar and the logger keep working; the rollout buffer (on-policy) or replay
    buffer (off-policy) gets what SB3's own loop would put there (see ``docs/adapters.md`` for
    the few differences).

    Args:
        model: a ``stable_baselines3`` ``PPO`` or ``A2C`` (any ``OnPolicyAlgorithm`` that keeps
            SB3's ``collect_rollouts`` and an ``ActorCriticPolicy``), or ``SAC``, ``TD3``,
            ``DDPG``, ``DQN`` (any ``OffPolicyAlgorithm`` that keeps SB3's ``collect_rollouts``,
            e.g. sb3-contrib's TQC and QR-DQN), with an env.
        config: a fixed :class:`~auturi.Config` (its total envs must be ``model.n_envs``); no
            tuning then.
        tune: without ``config``, tune the layout online with
            :class:`auturi.tuner.OnlineTuner` (each rollout is one measurement; nothing is
            wasted), starting from the layout the model's VecEnv runs: serial for a
            ``DummyVecEnv``, an env worker per env for a ``SubprocVecEnv`` (started here,
            where the VecEnv started its own). ``False``: run ``Config.serial(n_envs)``.
        strategy: the tuner's search strategy (``"model"``, ``"grid"``, ``"optuna"``).
        budget_trials, budget_seconds: the tuner's budget: configs to measure, and wall
            seconds of the search (training included); default: the tuner's own.
        tuner_options: other :class:`~auturi.tuner.OnlineTuner` keyword arguments.
        budget: deprecated (an int, a float or a dict: the three above in one).
        backend: ``"shm"`` (processes and shared memory), ``"serial"`` or ``"ray"`` (one Ray
            actor per actor, spread over a Ray cluster's nodes; the envs must pickle, as for
            ``shm``).
        status_port: serve the status (tuner trials, throughput, config) over HTTP on this
            loopback port (``auturi.server``; 0 picks a free one, see ``model.auturi.server.url``).
        env_fn: a zero-argument callable returning one ``gymnasium.Env`` as the model's
            VecEnv builds each env (Monitor included, VecEnv wrappers excluded), or a list
            of ``n_envs`` of them. Needed only when the envs cannot be rebuilt from the
            model's VecEnv (:func:`auturi.adapters.sb3.recover.factories_from_vecenv`): a
            ``DummyVecEnv``'s envs are read here, a ``SubprocVecEnv``'s in its own worker
            processes, which stay as they are (the model's VecEnv is the user's: ``unwrap``
            gives it back, ``model.env.close()`` ends them).
        seed: env ``i`` is seeded ``seed + i`` and the exploration noise is keyed by it.
            Default: ``model.seed``, else the VecEnv's pending seeds, else a random one.
        deterministic: act with the mode of the action distribution (for tests/evaluation;
            on-policy only: off-policy exploration is the algorithm's own).
        worker_timeout: seconds a worker may go without progress (a stuck env step, a stopped
            process) before ``learn`` raises :class:`~auturi.WorkerError` naming it with its
            stack; ``None``: ``$AUTURI_WORKER_TIMEOUT``, else 60 s.
        address: with ``backend="ray"``, the Ray cluster (``"auto"``, ``"HOST:6379"``,
            ``"ray://HOST:10001"``); ``None``: the current connection, ``RAY_ADDRESS``, or a
            local instance. ``model.auturi.actor_places`` says where each actor runs.
        actor_resources: with ``backend="ray"``, what each Ray actor asks for beyond its
            layout's CPUs (``{"CPU": 2, "GPU": 0.5, "my_resource": 1}``).

    Raises:
        NotImplementedError: HER, gSDE, unsupported VecEnv wrappers or action distributions.
        EnvRebuildError: the envs cannot be rebuilt in another process and no ``env_fn``.
    """
    budget = resolve_budget(budget, budget_trials=budget_trials, budget_seconds=budget_seconds,
                            tuner_options=tuner_options)
    off_policy = _check_model(model)
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an auturi.Config, got {type(config).__name__}")
    check_face_options(backend, worker_timeout, address)
    if actor_resources and backend != "ray":
        raise ValueError(f"actor_resources are what each Ray actor asks for: they need backend='ray', got {backend!r}")
    n = int(model.n_envs)
    if config is not None and config.num_envs != n:
        raise total_envs_error(config, n, "the model's n_envs")

    t0 = time.perf_counter()
    base_venv, vec_layers, vecnorm = split_vec_wrappers(model.env)
    factories = _env_factories(model, env_fn, base_venv, vec_layers, vecnorm)
    t_envs = time.perf_counter()
    raw_space = (vecnorm.venv if vecnorm is not None else model.env).observation_space
    # The VecEnv's pending seeds before the model's: they are what SB3's next reset uses, and
    # a reseed after the model was built (``model.set_random_seed(s)``, ``env.seed(s)``) set
    # them; the model's own seed went into them when it was built.
    seeds = getattr(base_venv, "_seeds", None)
    seed = resolve_seed(seed, int(seeds[0]) if seeds and isinstance(seeds[0], (int, np.integer)) else None,
                        getattr(model, "seed", None))
    if off_policy:
        from auturi.adapters.sb3 import off_policy as replay

        adapter = replay.make_adapter(model, vecnorm)
        # In this process the replica acts with the model's own policy: no weights copied per
        # collect (1-step collects), the same tensors SB3's own collect_rollouts would use.
        adapter.share(model.policy)
    else:
        from auturi.adapters.sb3 import on_policy as replay

        adapter = _on_policy_adapter(model, vecnorm, deterministic)
    adapter.load_state(adapter.state_of(model, vecnorm))

    start = start_layout(base_venv, n, model_device(model)) if tune and config is None and backend == "shm" else None
    checks = nan_checks(model.env)
    executor_kwargs = ray_kwargs(backend, address, actor_resources)
    if any(w.raise_exception for w, _ in checks):
        # VecCheckNan(raise_exception=True) raises at the step that returned a NaN or inf; the
        # replay's check (handle.nan_checks) comes after the collect, in which the replicas had
        # already acted on it (a PPO replica failed on NaN logits before the replay ran). The
        # executor's check raises at that step, naming the env and the row.
        executor_kwargs["check_finite"] = True
    collector = build_collector(factories, adapter, n, config=config, tune=tune, strategy=strategy, budget=budget,
                                backend=backend, seed=seed, worker_timeout=worker_timeout, start=start,
                                workload={"sb3": type(model).__name__, "env": factories[0].name},
                                status_port=status_port, verbose=model.verbose >= 1,
                                executor_kwargs=executor_kwargs)
    handle = SB3Handle(collector, adapter, vecnorm, model.env, seed, raw_space, model=model)
    t_exec = time.perf_counter()
    if collector.tuner is not None and not off_policy:
        try:  # a cached choice's processes start now, as a fixed config's do, not inside learn
            collector.tuner.begin(int(model.n_steps))
        except BaseException:
            handle.close()
            raise
    handle.wrap_seconds = wrap_seconds(t0, t_envs, t_exec, time.perf_counter(), collector.tuner)
    if model.verbose >= 1:
        print(f"auturi: {describe_wrap(handle.wrap_seconds, handle.config)}")
    handle.guard_env_calls(base_venv)  # env_method / set_attr / get_attr go to the envs that train
    handle.nan_checks = checks
    model.auturi = handle
    model.collect_rollouts = types.MethodType(replay.collect_rollouts, model)
    model._excluded_save_params = types.MethodType(_excluded_save_params, model)
    return model


def wrap_seconds(t0: float, t_envs: float, t_exec: float, t_end: float, tuner: Any) -> dict[str, float]:
    """Where a wrap's seconds went (``model.auturi.wrap_seconds``): ``envs``, rebuilding the
    env recipes from the model's VecEnv (a ``SubprocVecEnv``'s are read in its workers);
    ``executor``, building the executor at its first layout (its processes, their servers'
    imports, the envs it makes); ``tuner``, the online tuner's wrap-time look (its profile,
    and any move, whose seconds are also ``moves``); ``total``."""
    moves = sum(float(m.get("seconds") or 0.0) for m in (tuner.reconfigures if tuner is not None else ()))
    return {"envs": t_envs - t0, "executor": t_exec - t_envs, "tuner": t_end - t_exec, "moves": moves,
            "total": t_end - t0}


def describe_wrap(secs: dict[str, float], config: Any) -> str:
    """One line of :func:`wrap_seconds`, as ``verbose=1`` prints it.

    >>> describe_wrap({"envs": 0.5, "executor": 2.0, "tuner": 3.0, "moves": 2.5, "total": 5.5}, "serial")
    'wrapped in 5.5 s: envs rebuilt 0.5 s, executor started 2.0 s, wrap-time look 3.0 s (moves 2.5 s); runs serial'
    """
    look = f", wrap-time look {secs['tuner']:.1f} s" + (f" (moves {secs['moves']:.1f} s)" if secs["moves"] else "")
    return (f"wrapped in {secs['total']:.1f} s: envs rebuilt {secs['envs']:.1f} s, executor started "
            f"{secs['executor']:.1f} s{look if secs['tuner'] >= 0.05 else ''}; runs {config}")


def _check_model(model: Any) -> bool:
    """Refuse, with the reason, what the face cannot run; ``True`` for an off-policy model."""
    try:
        from stable_baselines3.common.base_class import BaseAlgorithm
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    except ImportError as exc:  # pragma: no cover - SB3 is what the caller passed
        raise ImportError("auturi.adapters.sb3 needs stable-baselines3: pip install stable-baselines3") from exc

    if not isinstance(model, (OnPolicyAlgorithm, OffPolicyAlgorithm)):
        what = "an SB3 algorithm" if isinstance(model, BaseAlgorithm) else "not an SB3 algorithm"
        raise TypeError(f"auturi.wrap(model) expects a stable_baselines3 model (PPO or A2C on-policy; SAC, TD3, DDPG "
                        f"or DQN off-policy); got "
                        f"{type(model).__name__} ({what})")
    if "auturi" in vars(model):
        raise AuturiError("this model is already wrapped by auturi; call model.auturi.close() first (it leaves a plain SB3 model)")
    if isinstance(model, OffPolicyAlgorithm):
        from auturi.adapters.sb3.off_policy import check_model

        check_model(model)
    else:
        _check_on_policy(model, OnPolicyAlgorithm)
    if isinstance(model.observation_space, gym.spaces.Dict):
        raise NotImplementedError("Dict observation spaces are not supported by auturi.wrap yet")
    if model.env is None:
        raise AuturiError("the model has no env (loaded without env=?); call model.set_env(env) first")
    return isinstance(model, OffPolicyAlgorithm)


def _check_on_policy(model: Any, base: type) -> None:
    from stable_baselines3.common.policies import ActorCriticPolicy

    if type(model).collect_rollouts is not base.collect_rollouts:
        raise NotImplementedError(f"{type(model).__name__} overrides collect_rollouts (e.g. recurrent or masked "
                                  f"policies); auturi.wrap supports algorithms that use SB3's own loop (PPO, A2C)")
    if model.use_sde:
        raise NotImplementedError("gSDE (use_sde=True) is not supported by auturi.wrap yet: its exploration noise is "
                                  "a per-env matrix resampled every sde_sample_freq steps. Train with use_sde=False")
    if not isinstance(model.policy, ActorCriticPolicy):
        raise NotImplementedError(f"auturi.wrap needs an ActorCriticPolicy, got {type(model.policy).__name__}")
    if type(model.policy).forward is not ActorCriticPolicy.forward:
        raise NotImplementedError(f"{type(model.policy).__name__} overrides forward(); auturi.wrap re-implements "
                                  f"ActorCriticPolicy.forward to sample from its own noise, so it would not run it")
    dist = type(model.policy.action_dist).__name__
    if dist not in DISTRIBUTIONS:
        raise NotImplementedError(f"auturi.wrap supports the action distributions {sorted(DISTRIBUTIONS)}; this "
                                  f"policy uses {dist}")


def _on_policy_adapter(model: Any, vecnorm: Any, deterministic: bool) -> SB3PolicyAdapter:
    normalize = None
    if vecnorm is not None and vecnorm.norm_obs:
        normalize = {"epsilon": float(vecnorm.epsilon), "clip_obs": float(vecnorm.clip_obs)}
    kwargs = dict(model.policy_kwargs)
    kwargs["use_sde"] = False
    return SB3PolicyAdapter(model.policy_class, model.observation_space, model.action_space, kwargs,
                            type(model.policy.action_dist).__name__, learning_rate=float(model.lr_schedule(1)),
                            deterministic=deterministic, normalize=normalize)


def _env_factories(model: Any, env_fn: Any, base_venv: Any, vec_layers: list[tuple], vecnorm: Any) -> list[EnvFactory]:
    """One recipe per env, from ``env_fn`` or recovered from the VecEnv, checked against the
    model's spaces by building one."""
    n = int(model.n_envs)
    if env_fn is not None:
        fns = list(env_fn) if isinstance(env_fn, Sequence) else [env_fn] * n
        if len(fns) != n or not all(callable(f) for f in fns):
            raise TypeError(f"env_fn must be a zero-argument callable returning a gymnasium.Env, or a list of "
                            f"n_envs={n} of them")
        factories = [EnvFactory(("fn", f), name=getattr(f, "__name__", "env_fn")) for f in fns]
    else:
        factories = factories_from_vecenv(base_venv)
    factories = [f.with_layers(vec_layers) for f in factories]
    raw_space = (vecnorm.venv if vecnorm is not None else model.env).observation_space
    probe = factories[0]()
    try:
        if not isinstance(probe, gym.Env):
            raise TypeError(f"the env factory returned {type(probe).__name__}, not a gymnasium.Env")
        if not same_space(probe.observation_space, raw_space) or not same_space(probe.action_space,
                                                                                model.action_space):
            raise EnvRebuildError(
                f"the rebuilt env does not match the model: observation space {probe.observation_space} vs "
                f"{raw_space}, action space {probe.action_space} vs {model.action_space}. "
                + ("Check env_fn: it must return the env as the VecEnv holds it, without VecEnv wrappers"
                   if env_fn is not None else ENV_FN_HINT))
    finally:
        probe.close()
    return factories


def unwrap_sb3(model: Any) -> Any:
    """Close the executor and give ``model`` back its own ``collect_rollouts``, as
    ``model.auturi.close()`` does. Returns it."""
    h = vars(model).get("auturi")
    if h is not None:
        h.close()
    for name in PATCHED:
        vars(model).pop(name, None)
    return model
