"""``auturi.wrap(config)`` for RLlib: which ``AlgorithmConfig`` s it takes
(:func:`check_supported`), :func:`wrap_rllib` and :func:`unwrap_rllib`."""
from __future__ import annotations

from typing import Any

from auturi.adapters.common import check_face_options, resolve_budget
from auturi.adapters.rllib.base import OPTIONS_ATTR, UnsupportedConfigError
from auturi.adapters.rllib.runner import runner_class
from auturi.config import Config
from auturi.errors import AuturiError, ConfigError

__all__ = ["SUPPORTED", "check_algorithm", "check_supported", "runner_resources", "unwrap_rllib", "wrap_rllib"]


SUPPORTED = ("PPO", "APPO", "IMPALA", "DQN", "SAC")
"""The RLlib algorithms ``auturi.wrap`` runs (their configs and subclasses of them): the
single-agent new-stack algorithms whose EnvRunner samples timesteps with the module's own
exploration (a distribution, or DQN's epsilon-greedy)."""


def check_algorithm(cfg: Any) -> None:
    """Refuse, with the fix, an algorithm outside :data:`SUPPORTED`, an offline one, and the
    options of a supported one whose exploration the replicas cannot reproduce."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig

    name = type(cfg).__name__
    if not isinstance(cfg, (PPOConfig, IMPALAConfig, DQNConfig, SACConfig)):
        raise UnsupportedConfigError(
            f"auturi.wrap supports RLlib {', '.join(SUPPORTED)} (their AlgorithmConfigs), not {name}: its EnvRunner "
            f"may sample in a way the executor does not reproduce. Train {name} without auturi.wrap")
    if cfg.input_ != "sampler":
        raise UnsupportedConfigError(
            f"{name} reads offline data (config.offline_data(input_={cfg.input_!r})); auturi.wrap speeds up online "
            f"sampling only. Train it without auturi.wrap")
    if isinstance(cfg, DQNConfig) and getattr(cfg, "noisy", False):
        raise UnsupportedConfigError(
            "DQN with noisy=True explores with noise drawn inside the network (NoisyNet), which the replicas cannot "
            "draw from the executor's noise; use epsilon-greedy (noisy=False) with auturi.wrap")


def check_supported(cfg: Any) -> None:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    if not isinstance(cfg, AlgorithmConfig):
        raise TypeError(f"auturi.wrap expects an RLlib AlgorithmConfig (e.g. PPOConfig()), got {type(cfg).__name__}")
    if getattr(cfg, "_is_frozen", False):
        raise AuturiError("this AlgorithmConfig is frozen (already used to build an algorithm); call auturi.wrap on "
                          "the config before build_algo(), e.g. auturi.wrap(PPOConfig()...).build_algo()")
    check_algorithm(cfg)
    if not (cfg.enable_rl_module_and_learner and cfg.enable_env_runner_and_connector_v2):
        raise UnsupportedConfigError(
            "auturi.wrap supports RLlib's new API stack only (RLModule, Learner, EnvRunner, ConnectorV2); this config "
            "uses the old stack. Remove config.api_stack(enable_rl_module_and_learner=False, ...)")
    if cfg.is_multi_agent:
        raise UnsupportedConfigError("multi-agent configs (config.multi_agent(...)) are not supported by auturi.wrap "
                                     "yet; it runs single-agent gymnasium envs")
    if not cfg.env:
        raise UnsupportedConfigError("config.env is not set: call config.environment('CartPole-v1') (or a "
                                     "registered env name / creator) before auturi.wrap")
    if cfg.env_runner_cls is not None:
        raise UnsupportedConfigError(f"the config already sets env_runner_cls={cfg.env_runner_cls.__name__}; "
                                     f"auturi.wrap replaces the EnvRunner and cannot combine with a custom one")
    if cfg._env_to_module_connector is not None or cfg._module_to_env_connector is not None:
        raise UnsupportedConfigError(
            "custom env-to-module / module-to-env connectors are not supported by auturi.wrap: the policy replicas "
            "run the module on raw observations in other processes, where those connectors do not run. Move "
            "observation preprocessing into a gymnasium wrapper inside your env creator (register_env), or train "
            "without auturi")
    if not (cfg.add_default_connectors_to_env_to_module_pipeline
            and cfg.add_default_connectors_to_module_to_env_pipeline):
        raise UnsupportedConfigError("auturi.wrap reproduces RLlib's default connector pipelines; do not turn them "
                                     "off (add_default_connectors_to_*_pipeline=False)")
    if str(cfg.gym_env_vectorize_mode).lower().split(".")[-1] == "vector_entrypoint":
        raise UnsupportedConfigError("gym_env_vectorize_mode='vector_entrypoint' (a custom vector env) is not "
                                     "supported by auturi.wrap: the executor steps single envs. Use 'sync'")
    if cfg.batch_mode != "truncate_episodes":
        raise UnsupportedConfigError(f"batch_mode={cfg.batch_mode!r} is not supported by auturi.wrap: the executor "
                                     f"collects fixed-length fragments. Use batch_mode='truncate_episodes'")
    if not cfg.explore:
        raise UnsupportedConfigError("auturi.wrap samples with the exploration distribution; training with "
                                     "explore=False is not supported")


def wrap_rllib(algo_config: Any, *, config: Config | None = None, tune: bool = True, strategy: str = "model",
               budget: Any = None, budget_trials: int | None = None, budget_seconds: float | None = None,
               tuner_options: dict[str, Any] | None = None, backend: str | None = None, address: str | None = None,
               seed: int | None = None, worker_timeout: float | None = None,
               status_port: int | None = None, total_timesteps: int | None = None) -> Any:
    """Make the algorithm built from ``algo_config`` sample through an Auturi executor.

    Returns the same ``AlgorithmConfig`` object (changed in place, like its builder methods):
    ``env_runner_cls=AuturiEnvRunner``, ``num_env_runners=0`` and ``num_envs_per_env_runner`` =
    the total envs ``max(1, num_env_runners) * num_envs_per_env_runner`` it had (so the train
    batch and the rollout fragment stay the same).

    Args:
        algo_config: an RLlib ``PPOConfig``, ``APPOConfig``, ``IMPALAConfig``, ``DQNConfig`` or
            ``SACConfig`` on the new API stack, single-agent, with an env.
        config: a fixed :class:`~auturi.Config` over the total envs; no tuning then.
        tune: without ``config``, tune the layout online with :class:`auturi.tuner.OnlineTuner`
            (each training iteration's collect is one measurement), starting from RLlib's own
            layout (one actor per EnvRunner). ``False``: run that layout.
        strategy, budget_trials, budget_seconds, tuner_options: the tuner's strategy and budget
            (as for :func:`auturi.wrap` on SB3); ``budget``: deprecated, as there.
        backend: ``"shm"`` (processes and shared memory on this machine), ``"serial"`` or
            ``"ray"`` (one Ray actor per Auturi actor, spread over the Ray cluster, each asking
            for the config's per-runner resources: ``num_cpus_per_env_runner`` and
            ``num_gpus_per_env_runner`` as a floor on its bundle, plus
            ``custom_resources_per_env_runner``). ``None`` (default): ``"ray"`` when
            ``address`` is given or, at ``build_algo()``, this process is connected to a Ray
            cluster of more than one alive node; else ``"shm"``.
        address: the Ray cluster (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``) for
            ``backend="ray"``, connected to here, at once (unreachable: :class:`~auturi.AuturiError`
            naming it); ``None``: the current connection, ``RAY_ADDRESS``, or a local
            instance. A lost actor or node fails ``train()`` with :class:`~auturi.WorkerError`
            naming it (``restart_failed_env_runners`` does not apply: a restarted actor's fresh
            envs would change the data; resume from a checkpoint).
        seed: env ``i`` is seeded ``seed + i`` and the action noise is keyed by it. Default:
            ``config.debugging(seed=...)`` (RLlib seeds its sub-envs the same way), else random.
        worker_timeout: seconds a worker may go without progress before ``train()`` raises
            :class:`~auturi.WorkerError` naming it with its stack; ``None``: 60 s (or
            ``$AUTURI_WORKER_TIMEOUT``).
        status_port: serve the status page (layout, throughput, where each actor runs) on
            this loopback port while training (0: a free one).
        total_timesteps: the env steps this training will sample in all, when your loop knows
            it (RLlib's ``Algorithm`` does not; SB3's ``learn(total_timesteps)`` tells the tuner
            itself). With it the online tuner moves to another layout only where the move
            pays back before the end, and may try a layout family its model could rank low
            when that would pay back twice over; without it, ``search_share`` caps the search.

    Raises:
        UnsupportedConfigError: another algorithm, the old API stack, multi-agent, custom
            connectors or EnvRunner, ``complete_episodes``, ``explore=False``.
    """
    # The arguments first: a typo fails here, not ten seconds into build_algo().
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an auturi.Config, got {type(config).__name__}")
    check_face_options("ray" if backend is None and address is not None else (backend or "shm"), worker_timeout,
                       address)
    _check_options(strategy=strategy, seed=seed, total_timesteps=total_timesteps, status_port=status_port)
    prior = getattr(algo_config, "__dict__", {}).get(OPTIONS_ATTR)
    if prior is not None and not getattr(algo_config, "_is_frozen", False):
        # Wrapped before (a notebook cell run twice, a helper that wraps): this wrap replaces
        # that one's options, over the EnvRunner settings the config had before either.
        runner_settings = (algo_config.env_runner_cls, algo_config.num_env_runners,
                           algo_config.num_envs_per_env_runner)
        unwrap_rllib(algo_config)
        try:
            return wrap_rllib(algo_config, config=config, tune=tune, strategy=strategy, budget=budget,
                              budget_trials=budget_trials, budget_seconds=budget_seconds,
                              tuner_options=tuner_options, backend=backend, address=address, seed=seed,
                              worker_timeout=worker_timeout, status_port=status_port,
                              total_timesteps=total_timesteps)
        except BaseException:  # the earlier wrap stands, as if this call had not been made
            setattr(algo_config, OPTIONS_ATTR, prior)
            algo_config.env_runner_cls = runner_settings[0]
            algo_config.env_runners(num_env_runners=runner_settings[1], num_envs_per_env_runner=runner_settings[2])
            raise
    check_supported(algo_config)
    if address is not None:
        # Now, not at build_algo(): RLlib's EnvRunnerGroup calls ray.put before it builds our
        # runner, and that auto-starts Ray with no address (a new local instance, or whichever
        # cluster this machine ran last, in token-auth mode if ~/.ray/auth_token exists).
        from auturi.executor.ray.cluster import connect

        connect(address)
    runners, per = int(algo_config.num_env_runners or 0), int(algo_config.num_envs_per_env_runner)
    total = max(1, runners) * per
    if config is not None and config.num_envs != total:
        raise ConfigError("num_actors*envs_per_actor", config.num_envs,
                          f"must equal the config's total envs max(1, num_env_runners) * num_envs_per_env_runner = "
                          f"{total}")
    # RLlib's own layout: one actor (EnvRunner) per num_env_runners, all its envs stepped in turn.
    start = Config.serial(total) if runners <= 1 else Config(num_actors=runners, envs_per_actor=per,
                                                             policy_batch_size=per)
    setattr(algo_config, OPTIONS_ATTR, {
        "config": config, "tune": bool(tune), "strategy": strategy, "backend": backend,
        "budget": resolve_budget(budget, budget_trials=budget_trials, budget_seconds=budget_seconds,
                                 tuner_options=tuner_options),
        "worker_timeout": worker_timeout, "address": address, "status_port": status_port,
        "actor_resources": runner_resources(algo_config),
        "seed": None if seed is None else int(seed), "start": start,
        "total_timesteps": None if total_timesteps is None else int(total_timesteps),
        "restore": {"num_env_runners": algo_config.num_env_runners, "num_envs_per_env_runner": per},
    })
    algo_config.env_runners(env_runner_cls=runner_class(), num_env_runners=0, num_envs_per_env_runner=total)
    return algo_config


def _check_options(*, strategy: Any, seed: Any, total_timesteps: Any, status_port: Any) -> None:
    """The options that would otherwise fail only inside ``build_algo()`` (after Ray and the
    EnvRunner have started), or be silently truncated (``seed=1.5``), refused here with the fix."""
    import numbers

    from auturi.tuner.strategies import STRATEGIES, Strategy

    if not isinstance(strategy, Strategy) and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {sorted(STRATEGIES)} (or a Strategy instance), got {strategy!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ValueError(f"seed must be a whole number >= 0 (env i is seeded seed + i; None: the config's "
                         f"debugging(seed=...)), got {seed!r}")
    if total_timesteps is not None:
        ok = (not isinstance(total_timesteps, bool) and isinstance(total_timesteps, numbers.Real)
              and total_timesteps > 0 and float(total_timesteps).is_integer())
        if not ok:
            raise ValueError(f"total_timesteps must be a positive whole number of env steps, e.g. 1_000_000 or "
                             f"1e6 (None: unknown), got {total_timesteps!r}")
    if status_port is not None and (isinstance(status_port, bool) or not isinstance(status_port, numbers.Integral)
                                    or not 0 <= status_port <= 65535):
        raise ValueError(f"status_port must be a port number in 0..65535 (0: any free port; None: no status "
                         f"server), got {status_port!r}")


def runner_resources(cfg: Any) -> dict[str, float]:
    """What each RLlib EnvRunner of ``cfg`` asked Ray for; on the ``ray`` backend each Auturi
    actor asks for at least as much (its layout may need more CPUs: one per process)."""
    out = {"CPU": float(cfg.num_cpus_per_env_runner or 0), "GPU": float(cfg.num_gpus_per_env_runner or 0)}
    out.update({str(k): float(v) for k, v in (cfg.custom_resources_per_env_runner or {}).items()})
    return {k: v for k, v in out.items() if v}


def unwrap_rllib(obj: Any) -> Any:
    """Undo :func:`wrap_rllib`. On an ``AlgorithmConfig``: restore its EnvRunner settings. On an
    ``Algorithm`` built from a wrapped config: end the executor's workers; its runner samples
    with RLlib's own loop from then on. Returns ``obj``."""
    from ray.rllib.algorithms.algorithm import Algorithm

    if isinstance(obj, Algorithm):
        h = getattr(obj.env_runner, "auturi", None)
        if h is not None:
            h.close()
        return obj
    opts = vars(obj).pop(OPTIONS_ATTR, None)
    if opts is not None:
        if getattr(obj, "_is_frozen", False):
            raise AuturiError("this AlgorithmConfig is frozen; unwrap the algorithm instead: auturi.unwrap(algo)")
        obj.env_runner_cls = None
        obj.env_runners(**opts["restore"])
    return obj
