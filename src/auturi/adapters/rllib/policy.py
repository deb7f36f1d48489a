"""Policy side of the RLlib face: :class:`RLModulePolicy`, an RLModule acting on the
executor's noise in the policy replicas (and in the runner's own process)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.rllib.base import UnsupportedConfigError
from auturi.device_wait import to_host
from auturi.sampling import categorical_from_uniform, normal_from_uniform

__all__ = ["EPSILON_KEY", "KINDS", "RLModulePolicy", "exploration_kind", "module_state"]

KINDS = ("categorical", "gaussian", "squashed_gaussian", "epsilon_greedy")
EPSILON_KEY = "__auturi__.epsilon"
"""The key under which DQN's current epsilon travels with the published weights."""


class RLModulePolicy:
    """An auturi :class:`~auturi.policy.Policy` around an RLlib torch ``RLModule``.

    Replicas rebuild the module from its ``RLModuleSpec`` (kept cloudpickled; ``inference_only``)
    and load the weights the executor publishes (the module's ``state_dict`` as numpy).
    In the EnvRunner's own process the runner's module is used directly (``module=``).

    Every action is drawn from the executor's per-env, per-step uniforms, so the data never
    depend on the layout. ``kind`` (see :func:`exploration_kind`) says how, as the module's
    own exploration would draw it:

    - ``categorical`` / ``gaussian`` / ``squashed_gaussian`` (PPO, APPO, IMPALA, SAC): the
      exploration distribution built from ``forward_exploration``'s ``action_dist_inputs``;
      inverse CDF for ``TorchCategorical``, ``loc + scale * ndtri(u)`` for ``TorchDiagGaussian``,
      then ``tanh`` into ``[-1, 1]`` for ``TorchSquashedGaussian``. ``action_logp`` is the
      distribution's ``logp`` of that action and ``action_dist_inputs`` are kept, as RLlib's
      ``GetActions`` connector leaves them;
    - ``epsilon_greedy`` (DQN): the greedy action of ``forward_inference``, replaced by a
      uniform random action where ``u[0] < epsilon`` (``u[1]`` picks it). ``epsilon`` is the
      runner's: it reaches the replicas with the weights (:data:`EPSILON_KEY`) before each
      collect. No extras, as DQN's module outputs none.

    Box actions go to the env unsquashed (``normalize_actions``) or clipped (``clip_actions``)
    as ``NormalizeAndClipActions`` does; the raw ones come back in the extra ``raw_actions``
    (what the episode stores).

    >>> import gymnasium as gym
    >>> p = RLModulePolicy(b"", gym.spaces.Discrete(3), "epsilon_greedy")
    >>> p.noise_dim, p.epsilon
    (2, 1.0)
    """

    # Imported once in the forkserver replicas fork from: rebuilding the module imports
    # RLlib, ~2 s per replica process and reconfigure otherwise.
    preload_modules = ("ray.rllib.core.rl_module.rl_module", "ray.rllib.core.rl_module.torch")

    def __init__(self, spec_blob: bytes, action_space: gym.Space, distribution: str, *,
                 normalize_actions: bool = True, clip_actions: bool = False, device: str = "cpu",
                 module: Any = None):
        if distribution not in KINDS:
            raise UnsupportedConfigError(f"auturi.wrap samples actions as one of {KINDS}, not {distribution}")
        self._spec_blob = spec_blob
        self.action_space = action_space
        self.kind = distribution
        self.normalize_actions, self.clip_actions = bool(normalize_actions), bool(clip_actions)
        self.device = device
        self.noise_dim = {"categorical": 1, "epsilon_greedy": 2}.get(distribution, int(np.prod(action_space.shape)))
        self.epsilon = 1.0  # epsilon_greedy only: set by the runner before each collect
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
        """The module's weights, plus :data:`EPSILON_KEY` for ``epsilon_greedy``."""
        state = module_state(self.module)
        if self.kind == "epsilon_greedy":
            state[EPSILON_KEY] = np.array([self.epsilon], np.float64)  # 1-d: weight blocks hold arrays
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        import torch

        weights = dict(state)
        if EPSILON_KEY in weights:
            self.epsilon = float(np.asarray(weights.pop(EPSILON_KEY)).reshape(-1)[0])
        # load_state_dict copies into the parameters; a read-only array (the ray backend's
        # weights come from the object store) is copied first only because torch warns on it.
        arrays = {k: np.asarray(v) for k, v in weights.items()}
        self.module.load_state_dict({k: torch.as_tensor(a if a.flags.writeable else a.copy())
                                     for k, a in arrays.items()})

    def act(self, obs: np.ndarray, noise: np.ndarray):
        import torch

        dev = torch.device(self.device)
        with torch.no_grad():
            batch = {"obs": torch.as_tensor(obs, device=dev)}
            u = torch.as_tensor(np.ascontiguousarray(noise), device=dev)
            if self.kind == "epsilon_greedy":
                return self._epsilon_greedy(batch, u), {}
            a, logp, inputs = self._from_distribution(batch, u)
        # one wait for the device's pass, then the three copies (device_wait.to_host)
        actions, logp, inputs = to_host(a, logp, inputs)
        extras = {"action_logp": logp, "action_dist_inputs": inputs}
        if self.kind == "categorical":
            return actions, extras
        actions = actions.reshape((-1, *self.action_space.shape)).astype(np.float32, copy=False)
        extras["raw_actions"] = actions
        return self._for_env(actions), extras

    def _from_distribution(self, batch: dict, u: Any) -> tuple[Any, Any, Any]:
        """The actions sampled from ``u``, their log-probabilities and the distribution's
        inputs (float32), as tensors on the module's device."""
        module = self.module
        if self._dist_cls is None:
            self._dist_cls = module.get_exploration_action_dist_cls()
        inputs = module.forward_exploration(batch)["action_dist_inputs"]
        dist = self._dist_cls.from_logits(inputs)
        if self.kind == "categorical":
            a = categorical_from_uniform(dist._dist.probs, u[:, 0])
        else:
            a = normal_from_uniform(dist._dist.loc, dist._dist.scale, u)
            if self.kind == "squashed_gaussian":
                a = dist._squash(a)  # tanh into [low, high] (RLlib's default [-1, 1]), as its sample()
        return a, dist.logp(a).float(), inputs.float()

    def _epsilon_greedy(self, batch: dict, u: Any) -> np.ndarray:
        """DQN's ``_forward_exploration`` with the executor's uniforms for its two ``torch`` draws
        (``rand() < epsilon``, then a uniform action). RLlib draws the random action among the
        actions whose Q-value is neither 0 nor -inf (an action mask); here among all ``n``."""
        import torch

        greedy = self.module.forward_inference(batch)["actions"].reshape(-1)
        n = int(self.action_space.n)
        random = torch.floor(u[:, 1].double() * n).long().clamp_(max=n - 1)
        return to_host(torch.where(u[:, 0].double() < self.epsilon, random, greedy.long()))[0]

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



def exploration_kind(module: Any) -> str:
    """How :class:`RLModulePolicy` draws actions for ``module``: ``epsilon_greedy`` for DQN's
    RLModules, else from the exploration distribution (``categorical``, ``gaussian``,
    ``squashed_gaussian``)."""
    from ray.rllib.algorithms.dqn.default_dqn_rl_module import DefaultDQNRLModule

    if isinstance(module, DefaultDQNRLModule):
        return "epsilon_greedy"
    name = module.get_exploration_action_dist_cls().__name__
    kinds = {"TorchCategorical": "categorical", "TorchDiagGaussian": "gaussian",
             "TorchSquashedGaussian": "squashed_gaussian"}
    if name not in kinds:
        raise UnsupportedConfigError(
            f"the RLModule's exploration distribution is {name}; auturi.wrap samples from the executor's noise and "
            f"supports TorchCategorical (Discrete actions), TorchDiagGaussian and TorchSquashedGaussian (Box "
            f"actions) and DQN's epsilon-greedy only")
    return kinds[name]
