"""One line around an RLlib ``AlgorithmConfig`` (new API stack, PPO): :func:`wrap_rllib`.

Still one module (over 500 lines): env recovery, the policy, the runner and wrapping become
a package by role when RLlib's other algorithms join, so it is split once.

``wrap_rllib(config)`` returns the same config object, set up so that the algorithm it builds
samples through an Auturi executor::

    from ray.rllib.algorithms.ppo import PPOConfig
    import auturi

    config = PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=8)
    algo = auturi.wrap(config).build_algo()
    algo.train()          # unchanged; result["env_runners"]["auturi"] reports the layout

How it fits into RLlib:

- the config gets ``env_runner_cls=AuturiEnvRunner`` and ``num_env_runners=0``: sampling
  happens in the local EnvRunner, in the algorithm's process, which owns one executor holding
  all ``num_env_runners * num_envs_per_env_runner`` envs (the tuner starts from RLlib's own
  layout: one actor per EnvRunner);
- :class:`AuturiEnvRunner` is a ``SingleAgentEnvRunner``: it keeps RLlib's module, connectors,
  metrics, callbacks and state handling, and replaces only the timestep-sampling loop. Each
  ``sample()`` runs ``executor.collect(T)`` (``T`` = the rollout fragment per env) and turns the
  time-major rollout into ``SingleAgentEpisode`` chunks, continuing ongoing episodes across
  calls (same id, ``cut()`` with the configured lookback) exactly as RLlib's runner does;
- the policy replicas run :class:`RLModulePolicy`: the RLModule's ``forward_exploration`` and
  the module's own action distribution, but the action is drawn from the executor's per-env,
  per-step uniforms (inverse CDF for Categorical, ``loc + scale * ndtri(u)`` for DiagGaussian),
  so the data never depend on the layout. Weights reach the replicas once per training
  iteration (after RLlib's weight sync), through ``executor.set_policy_state``;
- the envs are rebuilt in the workers from ``config.env`` (a gymnasium id, a ``register_env``
  name or an env creator) and ``env_config`` by :class:`RLlibEnvFactory`.

Importing this module imports neither ray nor torch: env workers unpickle its env factories.
The EnvRunner class itself (a ``SingleAgentEnvRunner`` subclass) is created on first access of
``auturi.adapters.rllib.AuturiEnvRunner``.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.common import check_face_options, tuner_kwargs
from auturi.sampling import categorical_from_uniform, normal_from_uniform
from auturi.config import Config
from auturi.errors import AuturiError, ConfigError

__all__ = ["AuturiEnvRunner", "RLlibEnvFactory", "RLlibHandle", "RLModulePolicy", "UnsupportedConfigError",
           "unwrap_rllib", "wrap_rllib"]

_OPTIONS = "_auturi_options"  # the attribute wrap_rllib sets on the AlgorithmConfig
_EXTRAS = ("action_logp", "action_dist_inputs")  # Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS


class UnsupportedConfigError(AuturiError, NotImplementedError):
    """The AlgorithmConfig uses something ``auturi.wrap`` cannot reproduce; the message names it
    and the fix."""


# =============================================================================== env side
# Runs in env workers: no ray, no torch at import.

class _EnvContext(dict):
    """What RLlib's ``EnvContext`` gives an env creator (the ``env_config`` dict plus
    ``worker_index``, ``num_workers``, ``vector_index``, ``remote``, ``recreated_worker``),
    without importing ray.rllib (which imports torch) in env workers."""

    def __init__(self, env_config: Mapping[str, Any], worker_index: int = 0, num_workers: int = 0,
                 vector_index: int = 0, remote: bool = False, recreated_worker: bool = False):
        super().__init__(env_config)
        self.worker_index, self.num_workers, self.vector_index = worker_index, num_workers, vector_index
        self.remote, self.recreated_worker = remote, recreated_worker

    def copy_with_overrides(self, env_config: Mapping[str, Any] | None = None, worker_index: int | None = None,
                            vector_index: int | None = None, remote: bool | None = None,
                            num_workers: int | None = None, recreated_worker: bool | None = None) -> _EnvContext:
        return _EnvContext(
            dict(self) if env_config is None else env_config,
            self.worker_index if worker_index is None else worker_index,
            self.num_workers if num_workers is None else num_workers,
            self.vector_index if vector_index is None else vector_index,
            self.remote if remote is None else remote,
            self.recreated_worker if recreated_worker is None else recreated_worker)

    def set_defaults(self, defaults: Mapping[str, Any]) -> None:
        for k, v in defaults.items():
            self.setdefault(k, v)


class RLlibEnvFactory:
    """A picklable recipe for one env as RLlib's ``SingleAgentEnvRunner.make_env`` builds each
    sub-env: ``gym.make(env_spec, **env_config)`` for a gymnasium id (its registered spec), or ``creator(env_context)``
    for a ``register_env`` name or a callable ``config.env`` (kept cloudpickled, so an env
    worker imports only what the creator itself needs)."""

    def __init__(self, kind: str, payload: Any, env_config: Mapping[str, Any], name: str):
        if kind not in ("make", "creator"):
            raise ValueError(f"unknown env recipe kind {kind!r}")
        self.kind, self.payload, self.env_config, self.name = kind, payload, dict(env_config), name
        self._creator = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_creator"] = None
        return d

    def __call__(self) -> gym.Env:
        if self.kind == "make":
            return gym.make(self.payload, **self.env_config)
        if self._creator is None:
            import cloudpickle

            self._creator = cloudpickle.loads(self.payload)
        env = self._creator(_EnvContext(self.env_config))
        if not isinstance(env, gym.Env):
            raise UnsupportedConfigError(
                f"the env creator for {self.name!r} returned a {type(env).__name__}, not a gymnasium.Env; auturi.wrap "
                f"supports single-agent gymnasium envs only (not MultiAgentEnv or vector envs)")
        return env

    def __repr__(self) -> str:
        return f"RLlibEnvFactory({self.kind}, {self.name})"


# ============================================================================ policy side
class RLModulePolicy:
    """An auturi :class:`~auturi.policy.Policy` around an RLlib torch ``RLModule``.

    Replicas rebuild the module from its ``RLModuleSpec`` (kept cloudpickled; ``inference_only``)
    and load the weights the executor publishes (the module's ``state_dict`` as numpy).
    In the EnvRunner's own process the runner's module is used directly (``module=``).

    ``act`` runs ``forward_exploration`` under ``no_grad`` and builds the module's exploration
    action distribution from ``action_dist_inputs``, then draws the action from the executor's
    noise: inverse CDF for ``TorchCategorical``, ``loc + scale * ndtri(u)`` for
    ``TorchDiagGaussian``. ``action_logp`` is the distribution's ``logp`` of that action, as
    RLlib's ``GetActions`` connector computes it. Box actions go to the env unsquashed
    (``normalize_actions``) or clipped (``clip_actions``) as ``NormalizeAndClipActions`` does;
    the raw ones come back in the extra ``raw_actions`` (what the episode stores).
    """

    # Imported once in the forkserver replicas fork from: rebuilding the module imports
    # RLlib, ~2 s per replica process and reconfigure otherwise.
    preload_modules = ("ray.rllib.core.rl_module.rl_module", "ray.rllib.core.rl_module.torch")

    def __init__(self, spec_blob: bytes, action_space: gym.Space, distribution: str, *,
                 normalize_actions: bool = True, clip_actions: bool = False, device: str = "cpu",
                 module: Any = None):
        if distribution not in ("categorical", "gaussian"):
            raise UnsupportedConfigError(f"auturi.wrap supports Categorical and DiagGaussian action distributions, "
                                         f"not {distribution}")
        self._spec_blob = spec_blob
        self.action_space = action_space
        self.kind = distribution
        self.normalize_actions, self.clip_actions = bool(normalize_actions), bool(clip_actions)
        self.device = device
        self.noise_dim = 1 if distribution == "categorical" else int(np.prod(action_space.shape))
        self._module = module
        self._dist_cls = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_module"] = None  # replicas build their own and load the published weights
        d["_dist_cls"] = None
        return d

    @property
    def module(self) -> Any:
        if self._module is None:
            import cloudpickle
            import torch

            spec = cloudpickle.loads(self._spec_blob)
            with torch.random.fork_rng(devices=[]):  # building draws initial weights
                module = spec.build()
            self._module = module.to(torch.device(self.device))
        return self._module

    def to(self, device: str) -> None:
        """Move to ``device``; builds the module now (during the reconfigure) if needed."""
        import torch

        self.device = device
        self.module.to(torch.device(device))

    def get_state(self) -> dict[str, np.ndarray]:
        return module_state(self.module)

    def load_state(self, state: Mapping[str, Any]) -> None:
        import torch

        self.module.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()})

    def act(self, obs: np.ndarray, noise: np.ndarray):
        import torch

        module = self.module
        if self._dist_cls is None:
            self._dist_cls = module.get_exploration_action_dist_cls()
        dev = torch.device(self.device)
        with torch.no_grad():
            out = module.forward_exploration({"obs": torch.as_tensor(obs, device=dev)})
            inputs = out["action_dist_inputs"]
            dist = self._dist_cls.from_logits(inputs)
            u = torch.as_tensor(np.ascontiguousarray(noise), device=dev)
            if self.kind == "categorical":
                a = categorical_from_uniform(dist._dist.probs, u[:, 0])
            else:
                a = normal_from_uniform(dist._dist.loc, dist._dist.scale, u)
            logp = dist.logp(a)
        extras = {"action_logp": logp.float().cpu().numpy(), "action_dist_inputs": inputs.float().cpu().numpy()}
        actions = a.cpu().numpy()
        if self.kind == "categorical":
            return actions, extras
        actions = actions.reshape((-1, *self.action_space.shape)).astype(np.float32, copy=False)
        extras["raw_actions"] = actions
        return self._for_env(actions), extras

    def _for_env(self, actions: np.ndarray) -> np.ndarray:
        s = self.action_space
        if self.normalize_actions and np.all(s.bounded_below) and np.all(s.bounded_above):
            return np.clip(s.low + (actions + 1.0) * (s.high - s.low) / 2.0, s.low, s.high).astype(s.dtype)
        if self.normalize_actions or self.clip_actions:
            return np.clip(actions, s.low, s.high).astype(s.dtype)
        return actions.astype(s.dtype)


def module_state(module: Any) -> dict[str, np.ndarray]:
    """A torch module's ``state_dict`` as numpy arrays (copies)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


# ================================================================================ handle
class RLlibHandle:
    """What the :class:`AuturiEnvRunner` keeps as ``runner.auturi`` (``algo.env_runner.auturi``):
    the executor, the optional online tuner and the last collect's stats."""

    def __init__(self, executor: Any, tuner: Any, adapter: RLModulePolicy, seed: int):
        self.executor, self.tuner, self.adapter, self.seed = executor, tuner, adapter, seed
        self.last_stats: Any = None
        self.collects = 0
        self.closed = False

    @property
    def config(self) -> Config:
        return self.executor.config

    def collect(self, num_steps: int) -> Any:
        rollout = (self.tuner if self.tuner is not None else self.executor).collect(num_steps)
        self.collects += 1
        self.last_stats = rollout.stats
        return rollout

    def info(self) -> dict[str, Any]:
        """What goes to ``result["env_runners"]["auturi"]``."""
        st = self.last_stats
        out: dict[str, Any] = {
            "config": str(self.executor.config),
            "phase": self.tuner.phase if self.tuner is not None else "fixed",
            "steps_per_s": float(st.steps_per_second) if st is not None else float("nan"),
            "collect_s": float(st.seconds) if st is not None else float("nan"),
            "reconfigure_s": float(self.executor.last_reconfigure_seconds),
            "collects": self.collects,
        }
        t = self.tuner
        if t is not None:
            out["trials"] = len(t.history)
            best = t.best()
            if best is not None:
                out["best_steps_per_s"] = float(best.estimate)
            if t.locked is not None:
                res = t.result()
                out["choice"] = str(res.choice)
                gain = res.speedup("serial")
                if np.isfinite(gain):
                    out["speedup_vs_serial"] = float(gain)
        return out

    def close(self) -> None:
        """End the workers. Idempotent; the runner then samples with RLlib's own envs."""
        self.closed = True
        self.executor.close()


# ============================================================================ the runner
_RUNNER_CLS: type | None = None


def __getattr__(name: str) -> Any:
    if name == "AuturiEnvRunner":
        return _runner_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _runner_class() -> type:
    """Define :class:`AuturiEnvRunner` (a ``SingleAgentEnvRunner`` subclass) on first use, so
    importing this module does not import ray."""
    global _RUNNER_CLS
    if _RUNNER_CLS is not None:
        return _RUNNER_CLS
    from ray.rllib.core import COMPONENT_RL_MODULE
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    class AuturiEnvRunner(SingleAgentEnvRunner):
        """RLlib's ``SingleAgentEnvRunner`` whose timestep sampling runs on an Auturi executor
        (see the module doc). Calls it does not serve itself (``num_episodes``, random actions,
        ``explore`` different from the config's, evaluation runners, after ``unwrap``) go to
        RLlib's own loop over the runner's own vector env."""

        def __init__(self, *, config: Any, **kwargs: Any):
            super().__init__(config=config, **kwargs)
            self.auturi: RLlibHandle | None = None
            self._auturi_episodes: list[Any] = []
            self._auturi_dirty = True
            self._auturi_warned: set[str] = set()
            opts = getattr(self.config, _OPTIONS, None)
            if opts is None or self.config.in_evaluation or self.env is None:
                return
            if self.worker_index:
                raise UnsupportedConfigError(
                    "AuturiEnvRunner runs as the local EnvRunner only (num_env_runners=0): its executor holds all "
                    "the envs. Do not set num_env_runners after auturi.wrap(config); set it before, and the wrap "
                    "moves those envs into the executor")
            self.auturi = _build_handle(self, opts)
            self._auturi_episodes = [None] * self.auturi.executor.num_envs

        # -- sampling
        def _sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None, explore: bool,
                    random_actions: bool = False, force_reset: bool = False) -> list:
            h = self.auturi
            if (h is None or h.closed or num_timesteps is None or random_actions
                    or bool(explore) != bool(self.config.explore)):
                return super()._sample(num_timesteps=num_timesteps, num_episodes=num_episodes, explore=explore,
                                       random_actions=random_actions, force_reset=force_reset)
            if force_reset and "force_reset" not in self._auturi_warned:
                self._auturi_warned.add("force_reset")
                warnings.warn("AuturiEnvRunner ignores force_reset=True: the executor's envs continue their "
                              "episodes", stacklevel=2)
            n = h.executor.num_envs
            steps = max(1, math.ceil(num_timesteps / n))
            if self._auturi_dirty:
                h.executor.set_policy_state(module_state(self.module))
                self._auturi_dirty = False
            rollout = h.collect(steps)
            return _detached(self._auturi_to_episodes(rollout))

        def _auturi_to_episodes(self, r: Any) -> list:
            """Time-major rollout -> done episodes + ongoing chunks, as ``_sample`` returns them."""
            from ray.rllib.env.single_agent_episode import SingleAgentEpisode
            from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

            T, N = r.num_steps, r.num_envs
            actions = _as_tensor_to_numpy_gives(r.extras.get("raw_actions", r.actions))
            logp, dist_inputs = (r.extras[k] for k in _EXTRAS)
            seq = self._weights_seq_no
            eps = self._auturi_episodes
            obs_space, act_space = self.env.single_observation_space, self.env.single_action_space
            done_eps: list = []
            for t in range(T):
                last = t == T - 1
                nxt_row = r.last_observations if last else r.observations[t + 1]
                for i in range(N):
                    ep = eps[i]
                    if ep is None or r.episode_starts[t, i]:
                        if ep is not None:
                            # A reconfigure recreated this env: its episode was cut (the chunks
                            # already returned bootstrap from their last observation) and never ends.
                            self._ongoing_episodes_for_metrics.pop(ep.id_, None)
                        ep = eps[i] = SingleAgentEpisode(observation_space=obs_space, action_space=act_space)
                        self._make_on_episode_callback("on_episode_created", i, eps)
                        ep.add_env_reset(observation=r.observations[t, i], infos={})
                        self._make_on_episode_callback("on_episode_start", i, eps)
                    term, trunc = r.terminated[t, i], r.truncated[t, i]  # numpy bools, as the vector env's
                    done = term or trunc
                    ep.add_env_step(
                        observation=r.final_observations[(t, i)] if done else nxt_row[i],
                        action=actions[t, i], reward=r.rewards[t, i],
                        infos=dict(r.final_infos.get((t, i), {})) if done else {},
                        terminated=term, truncated=trunc,
                        extra_model_outputs={"action_logp": logp[t, i], "action_dist_inputs": dist_inputs[t, i],
                                             WEIGHTS_SEQ_NO: seq})
                    self._make_on_episode_callback("on_episode_step", i, eps)
                    if done:
                        self._make_on_episode_callback("on_episode_end", i, eps)
                        done_eps.append(ep.to_numpy() if self.episodes_to_numpy else ep)
                        eps[i] = None
            self._done_episodes_for_metrics.extend(done_eps)
            ongoing: list = []
            for i, ep in enumerate(eps):
                if ep is None:
                    continue
                eps[i] = ep.cut(len_lookback_buffer=self.config.episode_lookback_horizon)
                ep.validate()
                self._ongoing_episodes_for_metrics[ep.id_].append(ep)
                ongoing.append(ep.to_numpy() if self.episodes_to_numpy else ep)
            self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=T * N)
            self._increase_sampled_metrics(T * N, len(done_eps))
            return done_eps + ongoing

        # -- state, metrics, lifetime
        def set_state(self, state: Any) -> None:
            super().set_state(state)
            if COMPONENT_RL_MODULE in state:
                self._auturi_dirty = True  # the replicas get the weights before the next collect

        def get_metrics(self) -> Any:
            h = self.auturi
            if h is not None and h.last_stats is not None:
                for k, v in h.info().items():
                    self.metrics.log_value(("auturi", k), v, reduce="item")
            return super().get_metrics()

        def stop(self) -> None:
            try:
                if self.auturi is not None:
                    self.auturi.close()
            finally:
                super().stop()

        def __del__(self) -> None:
            h = getattr(self, "auturi", None)
            if h is not None:
                try:
                    h.close()
                except Exception:  # noqa: BLE001
                    pass

    AuturiEnvRunner.__module__ = __name__
    AuturiEnvRunner.__qualname__ = "AuturiEnvRunner"
    _RUNNER_CLS = AuturiEnvRunner
    return AuturiEnvRunner


def _as_tensor_to_numpy_gives(a: np.ndarray) -> np.ndarray:
    """``a`` with the dtype RLlib's ``TensorToNumpy`` connector gives the actions its runner
    stores (``convert_to_numpy(reduce_type=True)``): floats as float32, signed ints as int32
    (a ``Discrete`` action is an int32 in RLlib's episodes)."""
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(np.float32, copy=False)
    if np.issubdtype(a.dtype, np.signedinteger):
        return a.astype(np.int32, copy=False)
    return a


def _detached(episodes: list) -> list:
    """Copies of ``episodes`` for the caller (the learner), so the runner's own chunks stay as sampled.

    PPO's learner connector changes the episodes it gets in place (``AddOneTsToEpisodesAndTruncate``
    appends a bootstrap timestep, sets ``is_truncated`` and suffixes the id). RLlib's remote
    EnvRunners ship copies, but the local EnvRunner, which ``auturi.wrap`` makes the only one,
    would hand over the very chunks it keeps for ``get_metrics`` and ``prev_episode_chunks``:
    every ``sample()`` an episode spanned then added one step to its reported length (a 500-step
    Acrobot episode reported as 503). About 0.7 ms per 128-step chunk."""
    import copy

    return [copy.deepcopy(ep) for ep in episodes]


def _env_factory(runner: Any) -> RLlibEnvFactory:
    """The recipe of one sub-env, as ``SingleAgentEnvRunner.make_env`` builds it."""
    import cloudpickle
    from ray.tune.registry import ENV_CREATOR, _global_registry

    cfg = runner.config
    env, env_config = cfg.env, dict(cfg.env_config or {})
    if isinstance(env, str) and _global_registry.contains(ENV_CREATOR, env):
        creator, name = _global_registry.get(ENV_CREATOR, env), env
    elif callable(env):
        creator, name = env, getattr(env, "__name__", type(env).__name__)
    else:
        # The registered spec, not the id: workers fork from a server that never saw a
        # gym.register() made at runtime in this process.
        spec = gym.spec(env) if env in gym.registry else env
        return RLlibEnvFactory("make", spec, env_config, name=str(env))
    try:
        blob = cloudpickle.dumps(creator)
    except Exception as exc:
        raise UnsupportedConfigError(
            f"the env creator for {name!r} cannot be pickled to the executor's workers ({type(exc).__name__}: "
            f"{exc}); register a module-level function with ray.tune.registry.register_env instead") from exc
    return RLlibEnvFactory("creator", blob, env_config, name=name)


def _distribution_kind(module: Any) -> str:
    name = module.get_exploration_action_dist_cls().__name__
    kinds = {"TorchCategorical": "categorical", "TorchDiagGaussian": "gaussian"}
    if name not in kinds:
        raise UnsupportedConfigError(
            f"the RLModule's exploration distribution is {name}; auturi.wrap samples from the executor's noise and "
            f"supports TorchCategorical (Discrete actions) and TorchDiagGaussian (Box actions) only")
    return kinds[name]


def _build_handle(runner: Any, opts: Mapping[str, Any]) -> RLlibHandle:
    import cloudpickle

    from auturi.executor import make_executor

    cfg, module = runner.config, runner.module
    if module is None:
        raise UnsupportedConfigError("the algorithm defines no RLModule for its EnvRunner; auturi.wrap needs one")
    if not hasattr(module, "state_dict"):
        raise UnsupportedConfigError(f"auturi.wrap needs a torch RLModule, got {type(module).__name__}")
    if module.is_stateful():
        raise UnsupportedConfigError("stateful (recurrent) RLModules are not supported by auturi.wrap yet: each "
                                     "replica would have to carry every env's hidden state. Train without "
                                     "use_lstm / use_attention, or without auturi")
    act_space = runner.env.single_action_space
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise UnsupportedConfigError(f"auturi.wrap supports Discrete and Box action spaces, not {act_space}")
    kind = _distribution_kind(module)
    spec = cfg.get_rl_module_spec(env=runner.env.unwrapped, spaces=runner.get_spaces(), inference_only=True)
    try:
        spec_blob = cloudpickle.dumps(spec)
    except Exception as exc:
        raise UnsupportedConfigError(f"the RLModuleSpec cannot be pickled to the policy replicas "
                                     f"({type(exc).__name__}: {exc})") from exc
    adapter = RLModulePolicy(spec_blob, act_space, kind, normalize_actions=cfg.normalize_actions,
                             clip_actions=cfg.clip_actions, module=module)
    factory = _env_factory(runner)
    probe = factory()
    try:
        if not isinstance(probe, gym.Env):
            raise UnsupportedConfigError(f"config.env {factory.name!r} builds a {type(probe).__name__}, not a "
                                         f"gymnasium.Env; auturi.wrap supports single-agent gymnasium envs")
        ok = (probe.observation_space == runner.env.single_observation_space
              and probe.action_space == act_space)
        if not ok:
            raise UnsupportedConfigError(
                f"the env rebuilt for the executor ({probe.observation_space}, {probe.action_space}) does not match "
                f"the EnvRunner's ({runner.env.single_observation_space}, {act_space})")
    finally:
        probe.close()
    n = runner.num_envs
    seed = opts.get("seed")
    if seed is None:
        seed = cfg.seed if cfg.seed is not None else int(np.random.randint(0, 2**31 - 1))
    start = opts.get("config") or opts["start"]
    if start.num_envs != n:
        raise ConfigError("num_actors*envs_per_actor", start.num_envs, f"must equal the total envs {n}")
    executor = make_executor([factory] * n, adapter, num_envs=n, config=start, backend=opts["backend"],
                             seed=int(seed), worker_timeout=opts.get("worker_timeout"))
    tuner = None
    try:
        if opts.get("config") is None and opts["tune"]:
            from auturi.tuner import OnlineTuner

            tuner = OnlineTuner(executor, strategy=opts["strategy"], seed=int(seed),
                                workload={"rllib": cfg.algo_class.__name__ if cfg.algo_class else "?",
                                          "env": factory.name},
                                **tuner_kwargs(opts.get("budget")))
    except BaseException:
        executor.close()
        raise
    return RLlibHandle(executor, tuner, adapter, int(seed))


# ================================================================================== wrap
def _check_supported(cfg: Any) -> None:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    if not isinstance(cfg, AlgorithmConfig):
        raise TypeError(f"auturi.wrap expects an RLlib AlgorithmConfig (e.g. PPOConfig()), got {type(cfg).__name__}")
    if getattr(cfg, "_is_frozen", False):
        raise AuturiError("this AlgorithmConfig is frozen (already used to build an algorithm); call auturi.wrap on "
                          "the config before build_algo(), e.g. auturi.wrap(PPOConfig()...).build_algo()")
    if not isinstance(cfg, PPOConfig):
        raise UnsupportedConfigError(
            f"auturi.wrap supports RLlib PPO (PPOConfig) for now, not {type(cfg).__name__}: other algorithms sample "
            f"asynchronously or off-policy (replay buffers, n-step targets). Train {type(cfg).__name__} without "
            f"auturi.wrap, or use PPO")
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
               budget: Any = None, backend: str = "shm", seed: int | None = None,
               worker_timeout: float | None = None) -> Any:
    """Make the algorithm built from ``algo_config`` sample through an Auturi executor.

    Returns the same ``AlgorithmConfig`` object (changed in place, like its builder methods):
    ``env_runner_cls=AuturiEnvRunner``, ``num_env_runners=0`` and ``num_envs_per_env_runner`` =
    the total envs ``max(1, num_env_runners) * num_envs_per_env_runner`` it had (so the train
    batch and the rollout fragment stay the same).

    Args:
        algo_config: an RLlib ``PPOConfig`` on the new API stack, single-agent, with an env.
        config: a fixed :class:`~auturi.Config` over the total envs; no tuning then.
        tune: without ``config``, tune the layout online with :class:`auturi.tuner.OnlineTuner`
            (each training iteration's collect is one measurement), starting from RLlib's own
            layout (one actor per EnvRunner). ``False``: run that layout.
        strategy, budget: the tuner's strategy and budget (as for :func:`auturi.wrap` on SB3).
        backend: ``"shm"`` (processes and shared memory) or ``"serial"``.
        seed: env ``i`` is seeded ``seed + i`` and the action noise is keyed by it. Default:
            ``config.debugging(seed=...)`` (RLlib seeds its sub-envs the same way), else random.
        worker_timeout: seconds a worker may go without progress before ``train()`` raises
            :class:`~auturi.WorkerError` naming it with its stack; ``None``: 60 s (or
            ``$AUTURI_WORKER_TIMEOUT``).

    Raises:
        UnsupportedConfigError: another algorithm, the old API stack, multi-agent, custom
            connectors or EnvRunner, ``complete_episodes``, ``explore=False``.
    """
    _check_supported(algo_config)
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an auturi.Config, got {type(config).__name__}")
    check_face_options(backend, worker_timeout)
    if seed is not None and int(seed) < 0:
        raise ValueError(f"seed must be >= 0 (env i is seeded seed + i), got {seed}")
    runners, per = int(algo_config.num_env_runners or 0), int(algo_config.num_envs_per_env_runner)
    total = max(1, runners) * per
    if config is not None and config.num_envs != total:
        raise ConfigError("num_actors*envs_per_actor", config.num_envs,
                          f"must equal the config's total envs max(1, num_env_runners) * num_envs_per_env_runner = "
                          f"{total}")
    # RLlib's own layout: one actor (EnvRunner) per num_env_runners, all its envs stepped in turn.
    start = Config.serial(total) if runners <= 1 else Config(num_actors=runners, envs_per_actor=per,
                                                             policy_batch_size=per)
    setattr(algo_config, _OPTIONS, {
        "config": config, "tune": bool(tune), "strategy": strategy, "budget": budget, "backend": backend,
        "worker_timeout": worker_timeout,
        "seed": None if seed is None else int(seed), "start": start,
        "restore": {"num_env_runners": algo_config.num_env_runners, "num_envs_per_env_runner": per},
    })
    algo_config.env_runners(env_runner_cls=_runner_class(), num_env_runners=0, num_envs_per_env_runner=total)
    return algo_config


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
    opts = vars(obj).pop(_OPTIONS, None)
    if opts is not None:
        if getattr(obj, "_is_frozen", False):
            raise AuturiError("this AlgorithmConfig is frozen; unwrap the algorithm instead: auturi.unwrap(algo)")
        obj.env_runner_cls = None
        obj.env_runners(**opts["restore"])
    return obj
