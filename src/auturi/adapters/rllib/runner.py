"""The runner side of the RLlib face: :class:`RLlibHandle` (the executor, the optional online
tuner, the last collect's stats) and ``AuturiEnvRunner``, a ``SingleAgentEnvRunner`` whose
timestep loop is an executor's ``collect`` turned into ``SingleAgentEpisode`` chunks.

The runner class is defined on first use (:func:`runner_class`), so importing this module
does not import ray."""
from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.common import (Collector, FaceHandle, build_collector, ray_kwargs, remaining_collects,
                                    resolve_seed)
from auturi.adapters.rllib.base import OPTIONS_ATTR, UnsupportedConfigError
from auturi.adapters.rllib.envs import env_factory
from auturi.adapters.rllib.policy import RLModulePolicy, exploration_kind
from auturi.config import total_envs_error

__all__ = ["RLlibHandle", "build_handle", "runner_class"]


class RLlibHandle(FaceHandle):
    """What the :class:`AuturiEnvRunner` keeps as ``runner.auturi`` (``algo.env_runner.auturi``):
    the shared :class:`~auturi.adapters.common.FaceHandle` (executor, optional online tuner,
    status server, last collect's stats) plus the replicas' policy adapter."""

    def __init__(self, collector: Collector, adapter: RLModulePolicy, seed: int,
                 total_timesteps: int | None = None):
        super().__init__(collector, seed)
        self.adapter = adapter
        self.closed = False
        self.total_timesteps = total_timesteps  # wrap(total_timesteps=): what the tuner's payback rule needs
        self.steps_sampled = 0

    def collect(self, num_steps: int) -> Any:
        """One collect of ``num_steps`` per env; the tuner is told the collects still to come
        when ``total_timesteps`` was given."""
        per = num_steps * self.executor.num_envs
        remaining = None
        if self.total_timesteps is not None:
            remaining = remaining_collects(self.total_timesteps - self.steps_sampled, per)
        rollout = self.collect_rollout(num_steps, remaining)
        self.steps_sampled += per
        return rollout

    def info(self) -> dict[str, Any]:
        """What goes to ``result["env_runners"]["auturi"]``: the layout, its speed, the tuner's
        state and, on the ``ray`` backend, where each actor runs (``actors``: ``"ip/pid"``
        per actor, ``nodes``: how many nodes they span)."""
        st = self.last_stats
        out: dict[str, Any] = {
            "config": str(self.executor.config),
            "backend": self.executor.backend,
            "phase": self.tuner.phase if self.tuner is not None else "fixed",
            "steps_per_s": float(st.steps_per_second) if st is not None else float("nan"),
            "collect_s": float(st.seconds) if st is not None else float("nan"),
            "reconfigure_s": float(self.executor.last_reconfigure_seconds),
            "collects": self.collects,
        }
        places = self.actor_places
        if places is not None:
            out["actors"] = [f"{p['ip']}/{p['pid']}" for p in places]
            out["nodes"] = len({p["node"] for p in places})
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
        """End the workers (and the status server). Idempotent; the runner then samples with
        RLlib's own envs."""
        self.closed = True
        super().close()


_RUNNER_CLS: type | None = None


def runner_class() -> type:
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
            opts = getattr(self.config, OPTIONS_ATTR, None)
            if opts is None or self.config.in_evaluation or self.env is None:
                return
            if self.worker_index:
                raise UnsupportedConfigError(
                    "AuturiEnvRunner runs as the local EnvRunner only (num_env_runners=0): its executor holds all "
                    "the envs. Do not set num_env_runners after auturi.wrap(config); set it before, and the wrap "
                    "moves those envs into the executor")
            self.auturi = build_handle(self, opts)
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
            if h.adapter.kind == "epsilon_greedy":
                self._auturi_update_epsilon(h.adapter)
            if self._auturi_dirty:
                h.executor.set_policy_state(h.adapter.get_state())
                self._auturi_dirty = False
            rollout = h.collect(steps)
            return _detached(self._auturi_to_episodes(rollout))

        def _auturi_update_epsilon(self, adapter: RLModulePolicy) -> None:
            """DQN: the epsilon of the module's schedule at this runner's lifetime step count (the
            ``t`` RLlib's runner passes ``forward_exploration``, num_env_runners being 0), held for
            the whole collect; a new value goes to the replicas with the weights."""
            schedule = self.module.epsilon_schedule
            schedule.update(self.num_env_steps_sampled_lifetime)
            eps = float(schedule.get_current_value())
            if eps != adapter.epsilon:
                adapter.epsilon = eps
                self._auturi_dirty = True

        def _auturi_to_episodes(self, r: Any) -> list:
            """Time-major rollout -> done episodes + ongoing chunks, as ``_sample`` returns them."""
            from ray.rllib.env.single_agent_episode import SingleAgentEpisode
            from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

            T, N = r.num_steps, r.num_envs
            actions = _as_tensor_to_numpy_gives(r.extras.get("raw_actions", r.actions))
            extras = {k: v for k, v in r.extras.items() if k != "raw_actions"}  # the module's outputs
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
                        extra_model_outputs={**{k: v[t, i] for k, v in extras.items()}, WEIGHTS_SEQ_NO: seq})
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
            if h is not None and h.closed:
                # Unwrapped: RLlib's own loop samples now, and the logger would keep reporting the
                # closed executor's last layout ("item" values stay until replaced).
                self.metrics.delete("auturi", key_error=False)
            elif h is not None and h.last_stats is not None:
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

    AuturiEnvRunner.__module__ = "auturi.adapters.rllib"  # its public home (the package serves it lazily)
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
    Acrobot episode reported as 503). DQN's and SAC's replay buffers likewise grow the first chunk
    of an episode in place as its next chunks arrive (``concat_episode``).

    The gymnasium spaces are shared, not copied (nothing downstream changes them; their
    ``np_random`` made the copy 4x slower): 0.18 ms for a 1-step chunk instead of 0.73 ms, which
    matters for DQN and SAC, whose ``sample()`` is one step per env by default."""
    import copy

    out = []
    for ep in episodes:
        spaces = (ep.observation_space, ep.action_space)
        out.append(copy.deepcopy(ep, {id(s): s for s in spaces if s is not None}))
    return out



def build_handle(runner: Any, opts: Mapping[str, Any]) -> RLlibHandle:
    import cloudpickle

    from auturi.executor import make_executor

    cfg, module = runner.config, runner.module
    act_space = runner.env.single_action_space
    # Before the module: RLlib's runner swallows its module's build error (module None), and an
    # action space neither can serve is the usual cause.
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise UnsupportedConfigError(f"auturi.wrap supports Discrete and Box action spaces, not {act_space}; give "
                                     f"the agent one with a gymnasium.ActionWrapper in your env creator (e.g. "
                                     f"Discrete(2**n) mapped onto MultiBinary(n))")
    if module is None:
        raise UnsupportedConfigError(f"the EnvRunner has no RLModule ({_module_build_error(runner)}); auturi.wrap "
                                     f"samples with the module, so it needs one that builds for this env")
    if not hasattr(module, "state_dict"):
        raise UnsupportedConfigError(f"auturi.wrap needs a torch RLModule, got {type(module).__name__}")
    if module.is_stateful():
        raise UnsupportedConfigError("stateful (recurrent) RLModules are not supported by auturi.wrap yet: each "
                                     "replica would have to carry every env's hidden state. Train without "
                                     "use_lstm / use_attention, or without auturi")
    kind = exploration_kind(module)
    spec = cfg.get_rl_module_spec(env=runner.env.unwrapped, spaces=runner.get_spaces(), inference_only=True)
    try:
        spec_blob = cloudpickle.dumps(spec)
    except Exception as exc:
        raise UnsupportedConfigError(f"the RLModuleSpec cannot be pickled to the policy replicas "
                                     f"({type(exc).__name__}: {exc})") from exc
    adapter = RLModulePolicy(spec_blob, act_space, kind, normalize_actions=cfg.normalize_actions,
                             clip_actions=cfg.clip_actions, module=module)
    factory = env_factory(runner)
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
    seed = resolve_seed(opts.get("seed"), cfg.seed)
    start = opts.get("config") or opts["start"]
    if start.num_envs != n:
        raise total_envs_error(start, n, "the total envs")
    backend = resolve_backend(opts["backend"], opts.get("address"))
    collector = build_collector(
        [factory] * n, adapter, n, config=opts.get("config"), start=start, tune=opts["tune"],
        strategy=opts["strategy"], budget=opts.get("budget"), backend=backend, seed=seed,
        worker_timeout=opts.get("worker_timeout"), status_port=opts.get("status_port"),
        workload=cache_workload(cfg, factory),
        executor_kwargs=ray_kwargs(backend, opts.get("address"), opts.get("actor_resources")))
    return RLlibHandle(collector, adapter, seed, opts.get("total_timesteps"))


def cache_workload(cfg: Any, factory: Any) -> dict[str, Any]:
    """What names this run's workload in the tuner's results cache, beside the spaces, env count
    and policy the tuner adds: the algorithm, and the env with its ``env_config`` (which can
    change what a step costs: ``max_episode_steps``, a simulator's frame skip), so runs of one
    env under different settings do not start from each other's choice."""
    env = factory.name
    if factory.env_config:
        env += " " + json.dumps(factory.env_config, sort_keys=True, default=repr)
    return {"rllib": cfg.algo_class.__name__ if cfg.algo_class else "?", "env": env}


def _module_build_error(runner: Any) -> str:
    """Why RLlib's runner has no module: building its spec again, the error it swallowed."""
    try:
        spec = runner.config.get_rl_module_spec(env=runner.env.unwrapped, spaces=runner.get_spaces(),
                                                inference_only=True)
        spec.build()
    except Exception as e:  # noqa: BLE001 - reported, not raised: the caller raises with it
        return f"building it raised {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return "the algorithm defines none for its EnvRunner"


def resolve_backend(backend: str | None, address: str | None) -> str:
    """``backend=None`` (the RLlib face's default): ``"ray"`` when an ``address`` is given or
    this process is connected to a Ray cluster of more than one alive node (sampling then
    stays spread over the cluster, as RLlib's remote EnvRunners were), else ``"shm"`` (on one
    machine shared memory beats Ray's object store, whatever ``num_env_runners`` was)."""
    if backend is not None:
        return backend
    if address is not None:
        return "ray"
    import ray

    if ray.is_initialized() and sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        return "ray"
    return "shm"
