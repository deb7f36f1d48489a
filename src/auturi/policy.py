"""The :class:`Policy` protocol the executor calls, simple numpy policies, and
:class:`TorchPolicy`, a helper around an ``nn.Module`` factory.

A policy maps a batch of observations to actions plus optional extra arrays (values,
log-probs). Randomness comes in as ``noise``: uniforms in [0, 1), one row per observation,
``noise_dim`` columns, drawn by the executor from a stream seeded per env and per step, so
how observations are batched never changes which random numbers an env sees.

This module does not import torch at import time: env workers import ``auturi`` too and
must not pay for (or initialise) torch.

Example:
    >>> import numpy as np, gymnasium as gym
    >>> from auturi.policy import RandomPolicy
    >>> p = RandomPolicy(gym.spaces.Discrete(3))
    >>> actions, extras = p.act(np.zeros((2, 4), np.float32), np.array([[0.1], [0.9]], np.float32))
    >>> actions.tolist()
    [0, 2]
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from auturi.device_wait import to_host
from auturi.sampling import categorical_from_uniform, normal_from_uniform

PolicyOutput = tuple[np.ndarray, dict[str, np.ndarray]]


@runtime_checkable
class Policy(Protocol):
    """What the executor needs of a policy. Replicas are made by unpickling the policy
    object in each worker, then loading the state the caller set.

    Any object with these members is one (no base class needed); define it at module level
    so the ``shm`` and ``ray`` backends can pickle it:

    >>> import auturi, numpy as np
    >>> from auturi.envs import CountingEnv   # Box(4,) observations, Discrete(3) actions
    >>> class FirstLargest:
    ...     noise_dim = 0                        # deterministic: takes no random numbers
    ...     def act(self, obs, noise):
    ...         return obs[:, :3].argmax(axis=1), {"scores": obs[:, :3].max(axis=1)}
    ...     def get_state(self): return {}
    ...     def load_state(self, state): pass
    ...     def to(self, device): pass
    >>> isinstance(FirstLargest(), auturi.Policy)
    True
    >>> with auturi.make_executor(CountingEnv, FirstLargest(), num_envs=2, backend="serial") as ex:
    ...     r = ex.collect(5)
    >>> r.actions.shape, r.extras["scores"].shape
    ((5, 2), (5, 2))
    """

    noise_dim: int
    """Uniform random numbers the policy consumes per observation (0: deterministic)."""

    def act(self, obs: np.ndarray, noise: np.ndarray) -> PolicyOutput:
        """``obs`` is ``(B, *obs_shape)``, ``noise`` is ``(B, noise_dim)`` float32.
        Returns actions ``(B, *action_shape)`` and extras, each ``(B, ...)``."""
        ...

    def get_state(self) -> Mapping[str, np.ndarray]:
        """The weights, as named numpy arrays."""
        ...

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Load weights produced by :meth:`get_state` (or the learner's)."""
        ...

    def to(self, device: str) -> None:
        """Move to ``cpu``, ``cuda`` or ``cuda:k``; called once in each replica."""
        ...

    # Optional: ``preload_modules``, a tuple of module names the ``shm`` backend imports once
    # in the forkserver its replicas fork from (torch always is), for policies whose imports
    # take seconds (RLlib's); each replica process then starts in milliseconds.
    # Optional: ``needs_torch = False`` for a policy that never imports torch: when the caller
    # has imported torch, the ``shm`` backend otherwise starts a forkserver that imports it
    # (seconds of a core) to fork replicas from.
    # Optional: ``load_state_copies = True`` for a policy whose ``load_state`` copies the
    # values into its own storage and keeps no reference to (or view of) the arrays it got:
    # replicas then load straight from the shared weights block, with no private copy first
    # (for any other policy the ``shm`` backend copies the state out of it before the load).


class _StatelessPolicy:
    """Shared plumbing for policies without weights."""

    noise_dim = 0
    needs_torch = False
    load_state_copies = True  # loads nothing, keeps nothing

    def get_state(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        pass

    def to(self, device: str) -> None:
        pass


class ConstantPolicy(_StatelessPolicy):
    """Always the same action (the env-stepping microbenchmarks use it): ``action``, or
    the space's lowest Discrete action / the Box action nearest zero.

    >>> import gymnasium as gym, numpy as np
    >>> from auturi import ConstantPolicy
    >>> p = ConstantPolicy(gym.spaces.Box(-1, 1, (2,)), action=[0.5, -0.5])
    >>> actions, extras = p.act(np.zeros((3, 4), np.float32), np.zeros((3, 0), np.float32))
    >>> actions.tolist(), extras
    ([[0.5, -0.5], [0.5, -0.5], [0.5, -0.5]], {})
    >>> ConstantPolicy(gym.spaces.Discrete(3, start=1)).action
    array(1)
    """

    def __init__(self, action_space: gym.Space, action: Any = None):
        self.action = np.asarray(action if action is not None else _zero_action(action_space),
                                 dtype=action_space.dtype)

    def act(self, obs: np.ndarray, noise: np.ndarray) -> PolicyOutput:
        # A read-only view, kept per batch size: callers copy it out, and building it again
        # was the largest cost of a one-env row.
        n = len(obs)
        cache = self.__dict__.setdefault("_by_n", {})
        out = cache.get(n)
        if out is None:
            out = cache[n] = np.broadcast_to(self.action, (n, *self.action.shape))
        return out, {}


class RandomPolicy(_StatelessPolicy):
    """Uniform random actions drawn from ``noise`` (Discrete and Box spaces); Box bounds that
    are infinite are taken as -1 or 1. The executor draws ``noise`` per env and step, so the
    actions do not depend on the layout.

    >>> import gymnasium as gym, numpy as np
    >>> from auturi import RandomPolicy
    >>> p = RandomPolicy(gym.spaces.Discrete(4))
    >>> p.noise_dim                                    # one uniform per observation
    1
    >>> p.act(np.zeros((3, 2)), np.array([[0.0], [0.5], [0.99]]))[0].tolist()
    [0, 2, 3]
    >>> box = RandomPolicy(gym.spaces.Box(0.0, 2.0, (2,)))
    >>> box.act(np.zeros((1, 2)), np.array([[0.25, 0.5]]))[0].tolist()
    [[0.5, 1.0]]
    """

    def __init__(self, action_space: gym.Space):
        self.space = action_space
        if isinstance(action_space, gym.spaces.Discrete):
            self.noise_dim = 1
        elif isinstance(action_space, gym.spaces.Box):
            self.noise_dim = int(np.prod(action_space.shape))
        else:
            raise TypeError(f"RandomPolicy supports Discrete and Box action spaces, not {action_space}")

    def act(self, obs: np.ndarray, noise: np.ndarray) -> PolicyOutput:
        s = self.space
        if isinstance(s, gym.spaces.Discrete):
            a = s.start + np.minimum((noise[:, 0] * s.n).astype(np.int64), s.n - 1)
            return a, {}
        low = np.where(np.isfinite(s.low), s.low, -1.0)
        high = np.where(np.isfinite(s.high), s.high, 1.0)
        a = low + noise.reshape(len(obs), *s.shape) * (high - low)
        return a.astype(s.dtype), {}


def _zero_action(space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Discrete):
        return space.start
    if isinstance(space, gym.spaces.Box):
        return np.clip(np.zeros(space.shape, space.dtype), space.low, space.high)
    raise TypeError(f"no default constant action for {space}; pass action=")


class TorchPolicy:
    """A :class:`Policy` around a factory of an ``nn.Module`` whose ``forward(obs)``
    returns ``(dist_params, value)``: logits for a Discrete action space, the mean for a
    Box one (the module may hold a ``log_std`` parameter; otherwise std is 1).

    Extras are ``values`` and ``log_probs``. Sampling uses the executor's per-env noise:
    inverse CDF for Discrete, ``mean + std * ndtri(u)`` for Box. The module is built
    lazily, so pickling a ``TorchPolicy`` ships the factory, not the weights.

    Example:
        >>> import gymnasium as gym, numpy as np
        >>> from auturi.policy import TorchPolicy
        >>> from auturi.nets import MLPActorCritic
        >>> obs_space, act_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
        >>> p = TorchPolicy(lambda: MLPActorCritic(4, 2), act_space)
        >>> a, ex = p.act(np.zeros((3, 4), np.float32), np.full((3, 1), 0.5, np.float32))
        >>> a.shape, sorted(ex)
        ((3,), ['log_probs', 'values'])
    """

    def __init__(self, model_fn: Callable[[], Any], action_space: gym.Space,
                 deterministic: bool = False, device: str = "cpu"):
        self.model_fn = model_fn
        self.action_space = action_space
        self.deterministic = deterministic
        self.device = device
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"TorchPolicy supports Discrete and Box action spaces, not {action_space}")
        self.noise_dim = 0 if deterministic else (1 if self.discrete else int(np.prod(action_space.shape)))
        self._model = None

    # The built module stays behind when pickled: replicas build their own and load
    # the state the executor publishes.
    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_model"] = None
        return d

    @property
    def model(self):
        if self._model is None:
            import torch

            self._model = self.model_fn().to(torch.device(self.device))
            self._model.eval()
        return self._model

    def to(self, device: str) -> None:
        import torch

        self.device = device
        if self._model is not None:
            self._model.to(torch.device(device))

    load_state_copies = True  # load_state_dict copies into the parameters and keeps nothing

    def get_state(self) -> dict[str, np.ndarray]:
        # One copy to the host whatever the device (.cpu().numpy().copy() made two off the CPU).
        return {k: v.detach().to("cpu", copy=True).numpy() for k, v in self.model.state_dict().items()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        import torch

        # torch.as_tensor wraps a numpy array without a copy: load_state_dict's one copy_ per
        # tensor goes from the given arrays (views of the shared block in a replica) straight
        # into the parameters, host to device for a model on CUDA.
        self.model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()})

    def act(self, obs: np.ndarray, noise: np.ndarray) -> PolicyOutput:
        import torch

        model = self.model
        dev = torch.device(self.device)
        with torch.inference_mode():
            x = torch.as_tensor(obs, device=dev)
            if not torch.is_floating_point(x):
                x = x.float()
            params, value = model(x)
            if self.discrete:
                logp_all = torch.log_softmax(params, dim=-1)
                if self.deterministic:
                    a = logp_all.argmax(dim=-1)
                else:
                    a = categorical_from_uniform(logp_all.exp(), torch.as_tensor(noise[:, 0], device=dev))
                logp = logp_all.gather(-1, a.unsqueeze(-1)).squeeze(-1)
                a = a + int(self.action_space.start)
            else:
                log_std = getattr(model, "log_std", None)
                std = torch.exp(log_std) if log_std is not None else torch.ones_like(params)
                if self.deterministic:
                    a = params
                else:
                    a = normal_from_uniform(params, std, torch.as_tensor(noise, device=dev))
                logp = torch.distributions.Normal(params, std).log_prob(a).sum(dim=-1)
            actions, values, log_probs = to_host(a, value.reshape(-1).float(), logp.float())
            if not self.discrete:
                actions = actions.astype(self.action_space.dtype, copy=False)
            return actions, {"values": values, "log_probs": log_probs}
