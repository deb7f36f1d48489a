"""Policy side of the RLlib face: :class:`RLModulePolicy`, an RLModule acting on the
executor's noise in the policy replicas (and in the runner's own process)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.rllib.base import UnsupportedConfigError
from auturi.sampling import categorical_from_uniform, normal_from_uniform

__all__ = ["EXTRAS", "RLModulePolicy", "distribution_kind", "module_state"]

EXTRAS = ("action_logp", "action_dist_inputs")  # Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS


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

def distribution_kind(module: Any) -> str:
    name = module.get_exploration_action_dist_cls().__name__
    kinds = {"TorchCategorical": "categorical", "TorchDiagGaussian": "gaussian"}
    if name not in kinds:
        raise UnsupportedConfigError(
            f"the RLModule's exploration distribution is {name}; auturi.wrap samples from the executor's noise and "
            f"supports TorchCategorical (Discrete actions) and TorchDiagGaussian (Box actions) only")
    return kinds[name]

