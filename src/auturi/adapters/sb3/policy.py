"""The SB3 face's policy side: :class:`SB3PolicyAdapter` runs an SB3 ``ActorCriticPolicy``
(PPO, A2C) in the executor's replicas, sampling from the executor's per-env noise.

Nothing here imports torch or SB3 at import time: env workers unpickle the adapter too.

Over 400 lines on purpose: the replica's network, its sampling and the weights it publishes
and loads (:class:`ModelViews`, the shared tensors sent once) are one object's two sides, the
trainer's and the replica's; apart, each would need the other's naming of the tensors.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.device_wait import to_host
from auturi.sampling import categorical_from_uniform, normal_from_uniform

STATE_PREFIX = "auturi."  # keys of the state that carry VecNormalize statistics, not weights


class NoOptimizer:
    """Stands in for SB3's optimizer in the adapter's copies of the network, which never
    train: building Adam imports torch._dynamo on first use (~1.3 s and 800 modules, in each
    replica process, or in the forkserver they fork from)."""

    def __init__(self, params: Any, **kwargs: Any):
        pass


def _takes(cls: Any, name: str) -> bool:
    """Whether ``cls(...)`` accepts keyword ``name`` (its ``__init__`` names it)."""
    import inspect

    try:
        return name in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False


class ConstantSchedule:
    """A picklable learning-rate schedule (replicas never train; the optimizer SB3 builds
    needs one)."""

    def __init__(self, value: float):
        self.value = float(value)

    def __call__(self, progress_remaining: float) -> float:
        return self.value


DISTRIBUTIONS = {
    "CategoricalDistribution": "categorical",
    "DiagGaussianDistribution": "gaussian",
    "MultiCategoricalDistribution": "multicategorical",
    "BernoulliDistribution": "bernoulli",
}
"""The SB3 action distributions the on-policy adapter samples (class name -> kind)."""


class ReplicaNet:
    """What every SB3 policy adapter shares: the network rebuilt in each replica from
    ``policy_class(observation_space, action_space, lr_schedule, **policy_kwargs)`` (kept
    pickled, so unpickling the adapter in an env worker imports neither torch nor SB3), the
    state the executor publishes (weights, plus ``auturi.obs_mean`` / ``auturi.obs_var`` when
    ``VecNormalize`` statistics travel too), and VecNormalize's ``normalize_obs``.

    ``state_prefix``: only the weights under it are published and loaded (the part of the
    policy that acts: ``"actor."`` for SAC/TD3, ``"q_net."`` for DQN); ``""``: all."""

    # Imported once in the forkserver replicas fork from, not in each replica process.
    preload_modules = ("stable_baselines3.common.policies",)
    # load_state copies into the network's tensors and keeps no array it gets (the statistics
    # are copied too): replicas load straight from the shared weights block.
    load_state_copies = True

    def __init__(self, policy_class: type, observation_space: gym.Space, action_space: gym.Space,
                 policy_kwargs: Mapping[str, Any], *, learning_rate: float = 0.0,
                 normalize: Mapping[str, float] | None = None, device: str = "cpu", state_prefix: str = ""):
        import cloudpickle

        self._blob = cloudpickle.dumps((policy_class, observation_space, action_space, dict(policy_kwargs),
                                        float(learning_rate)))
        self.action_space = action_space
        self.normalize = dict(normalize) if normalize else None  # {"epsilon", "clip_obs"}
        self.device = device
        self.state_prefix = state_prefix
        if isinstance(action_space, gym.spaces.Box):
            self._low, self._high = action_space.low, action_space.high
        self._net = None
        self._slots: dict[str, Any] | None = None  # name -> the net's tensor, after a first load_state
        self._shared: Any = None  # the model's own policy, when this object acts with it (see share)
        self._views: ModelViews | None = None  # the model's tensors the published state is read from
        self._obs_mean: np.ndarray | None = None
        self._obs_var: np.ndarray | None = None

    def state_of(self, model: Any, vecnorm: Any) -> dict[str, np.ndarray]:
        """The state to publish before a collect: what :func:`policy_state` returns, read from
        the model's tensors found once (``state_dict()`` walks every module: ~90 us a collect
        for SAC, more than a 1-step collect's own overhead) and checked each time."""
        return {**self._model_views(model).arrays(), **obs_stats(vecnorm)}

    def weights_token(self, model: Any) -> tuple:
        """Changes whenever the published weights may have changed (see :meth:`ModelViews.token`)."""
        return self._model_views(model).token()

    def _model_views(self, model: Any) -> "ModelViews":
        """The views of ``model``'s tensors, rebuilt when they are no longer its own."""
        if self._views is None or not self._views.valid(model.policy):
            self._views = ModelViews(model.policy, self.state_prefix)
        return self._views

    def share(self, policy: Any) -> None:
        """Act with ``policy`` itself (the model's own, in the caller's process): no copy of
        the weights, and published weights are ignored, so this object always acts with the
        model's current weights, as SB3's own ``collect_rollouts`` does (training and
        collecting alternate in one thread). Replicas elsewhere (unpickled copies) build their
        own network and load what is published; :meth:`to` another device stops sharing."""
        self._shared = policy
        self._net = policy
        self._slots = None

    def follow(self, policy: Any) -> None:
        """Share ``policy`` instead when this object shares another (the model's ``policy``
        attribute was replaced): it acts with what the model holds, as the published state is."""
        if self._shared is not None and self._shared is not policy:
            self.share(policy)

    @property
    def shared(self) -> bool:
        """Whether this object acts with the model's own policy (see :meth:`share`)."""
        return self._shared is not None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_net"] = None  # replicas build their own and load the published state
        d["_slots"] = None
        d["_shared"] = None  # never pickle the model's policy into a replica
        d["_views"] = None
        return d

    @property
    def net(self):
        if self._net is None:
            import cloudpickle
            import torch

            policy_class, obs_space, act_space, kwargs, lr = cloudpickle.loads(self._blob)
            kwargs = {**kwargs, "optimizer_class": NoOptimizer}
            if not self.state_prefix and _takes(policy_class, "ortho_init"):
                # Every weight is loaded over (the whole state, strictly): SB3's orthogonal
                # init is work thrown away, a QR per layer; for the Nature CNN's 3136 x 512
                # layer 2 s a build on 2 cores (2026-11-27), paid at every wrap and replica.
                kwargs["ortho_init"] = False
            # Building draws initial weights: keep the caller's torch RNG stream untouched.
            with torch.random.fork_rng(devices=[]):
                net = policy_class(obs_space, act_space, ConstantSchedule(lr), **kwargs)
            net.set_training_mode(False)
            self._net = net.to(torch.device(self.device))
        return self._net

    def to(self, device: str) -> None:
        """Move to ``device``. Builds the network now if needed: the executor calls this
        once in each replica while it starts, so torch and SB3 load during the reconfigure
        (in parallel across workers) rather than in the first collect."""
        import torch

        if self._shared is not None:
            if _device_of(self._shared) == _indexed(torch.device(device)):
                self.device = device
                return
            self._unshare()
        self.device = device
        self._slots = None  # a move may give the parameters new storage
        if self._net is not None:
            self._net.to(torch.device(device))
        else:
            self.net  # noqa: B018 - builds on self.device

    def get_state(self) -> dict[str, np.ndarray]:
        # One copy to the host whatever the device (.cpu().numpy().copy() made two off the CPU),
        # each tensor once (see distinct_tensors).
        state = {k: v.detach().to("cpu", copy=True).numpy() for k, v in distinct_tensors(
            (k, v) for k, v in self.net.state_dict(keep_vars=True).items() if k.startswith(self.state_prefix))}
        if self._obs_mean is not None:
            state[STATE_PREFIX + "obs_mean"] = self._obs_mean.copy()
            state[STATE_PREFIX + "obs_var"] = self._obs_var.copy()
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        import torch

        self.load_obs_stats(state)
        if self._shared is not None:
            return  # acting with the model's own tensors: they are the current weights
        weights = {k: v for k, v in state.items() if not k.startswith(STATE_PREFIX)}
        slots = self._slots
        if slots is not None and slots.keys() == weights.keys():
            # The same names as last time (every collect, off-policy every step): copy the
            # values into the tensors in place; load_state_dict's checks and module walk cost
            # ~250 us a collect, more than a 1-step collect's own overhead. torch.as_tensor
            # wraps the array (in a replica: a view of the shared block) without a copy, so
            # each value is copied once, straight into the parameter: host to host on the
            # CPU, one host-to-device copy on CUDA (synchronous from pageable memory, so the
            # block may be rewritten as soon as this returns).
            with torch.no_grad():
                for k, v in weights.items():
                    src = torch.as_tensor(np.asarray(v))
                    if src.shape != slots[k].shape:
                        break
                    slots[k].copy_(src)
                else:
                    return
        # With a prefix the state holds the acting part only (the critic never travels). The
        # state holds each tensor once (see distinct_tensors): its other names here get the
        # same array, so a strict load still finds every key it expects.
        full = _with_aliases(self.net, weights)
        self.net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in full.items()},
                                 strict=not self.state_prefix)
        sd = self.net.state_dict()  # tensors that share the parameters' storage
        self._slots = {k: sd[k] for k in weights if k in sd}

    def _unshare(self) -> None:
        """Build an own network, holding the shared policy's current weights."""
        shared, self._shared, self._net, self._slots = self._shared, None, None, None
        self.net.load_state_dict(shared.state_dict())

    def load_obs_stats(self, state: Mapping[str, Any]) -> None:
        """Take the VecNormalize statistics of ``state`` (if it has them), not its weights."""
        if STATE_PREFIX + "obs_mean" in state:
            self._obs_mean = np.array(state[STATE_PREFIX + "obs_mean"], dtype=np.float64)
            self._obs_var = np.array(state[STATE_PREFIX + "obs_var"], dtype=np.float64)

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """VecNormalize's ``normalize_obs`` with the shipped statistics (identity without)."""
        if self.normalize is None or self._obs_mean is None:
            return obs
        n = self.normalize
        return np.clip((obs - self._obs_mean) / np.sqrt(self._obs_var + n["epsilon"]),
                       -n["clip_obs"], n["clip_obs"]).astype(np.float32)


class SB3PolicyAdapter(ReplicaNet):
    """An auturi :class:`~auturi.policy.Policy` that runs an SB3 ``ActorCriticPolicy`` (see
    :class:`ReplicaNet` for how replicas get it).

    ``act`` does SB3's forward pass (``obs_to_tensor``, features, latents, value, action
    distribution) but samples from the executor's noise: inverse CDF for Categorical (and
    each part of MultiCategorical), ``u < p`` for Bernoulli, ``mean + std * ndtri(u)`` for
    DiagGaussian. Box actions come back clipped to the action space (what the env gets) and
    unclipped in the extra ``raw_actions`` (what SB3 stores). Extras: ``values``,
    ``log_probs``.
    """

    def __init__(self, policy_class: type, observation_space: gym.Space, action_space: gym.Space,
                 policy_kwargs: Mapping[str, Any], distribution: str, *, learning_rate: float = 0.0,
                 deterministic: bool = False, normalize: Mapping[str, float] | None = None,
                 device: str = "cpu"):
        if distribution not in DISTRIBUTIONS:
            raise NotImplementedError(
                f"auturi.wrap supports SB3 policies whose action distribution is one of "
                f"{sorted(DISTRIBUTIONS)}; this policy uses {distribution}")
        super().__init__(policy_class, observation_space, action_space, policy_kwargs, learning_rate=learning_rate,
                         normalize=normalize, device=device)
        self.kind = DISTRIBUTIONS[distribution]
        self.deterministic = bool(deterministic)
        if self.deterministic:
            self.noise_dim = 0
        elif self.kind == "categorical":
            self.noise_dim = 1
        elif self.kind == "multicategorical":
            self.noise_dim = len(action_space.nvec)
        else:
            self.noise_dim = int(np.prod(action_space.shape))

    def act(self, obs: np.ndarray, noise: np.ndarray):
        import torch

        net = self.net
        with torch.no_grad():
            obs_t = net.obs_to_tensor(self.normalize_obs(obs))[0]
            features = net.extract_features(obs_t)
            if net.share_features_extractor:
                latent_pi, latent_vf = net.mlp_extractor(features)
            else:
                pi_features, vf_features = features
                latent_pi = net.mlp_extractor.forward_actor(pi_features)
                latent_vf = net.mlp_extractor.forward_critic(vf_features)
            values = net.value_net(latent_vf)
            dist = net._get_action_dist_from_latent(latent_pi)
            if self.deterministic:
                a = dist.get_actions(deterministic=True)
            else:
                a = self._sample(dist, torch.as_tensor(np.ascontiguousarray(noise), device=values.device))
            log_prob = dist.log_prob(a)
            a = a.reshape((-1, *self.action_space.shape))
            actions, values_np, log_probs = to_host(a, values.reshape(-1).float(), log_prob.reshape(-1).float())
            extras = {"values": values_np, "log_probs": log_probs}
        if isinstance(self.action_space, gym.spaces.Box):
            extras["raw_actions"] = actions
            return np.clip(actions, self._low, self._high), extras
        return actions, extras

    def _sample(self, dist: Any, u: Any):
        import torch

        if self.kind == "categorical":
            return categorical_from_uniform(dist.distribution.probs, u[:, 0])
        if self.kind == "multicategorical":
            return torch.stack([categorical_from_uniform(d.probs, u[:, j]) for j, d in enumerate(dist.distribution)],
                               dim=1)
        if self.kind == "bernoulli":
            return (u < dist.distribution.probs).to(dist.distribution.probs.dtype)
        normal = dist.distribution
        return normal_from_uniform(normal.mean, normal.stddev, u)



def policy_state(model: Any, vecnorm: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """What the replicas load: the policy's weights (those under ``prefix``) and, with
    VecNormalize, its observation statistics."""
    return {**ModelViews(model.policy, prefix).arrays(), **obs_stats(vecnorm)}


def obs_stats(vecnorm: Any) -> dict[str, np.ndarray]:
    """VecNormalize's observation statistics as the replicas load them (none without)."""
    if vecnorm is None or not vecnorm.norm_obs:
        return {}
    return {STATE_PREFIX + "obs_mean": np.asarray(vecnorm.obs_rms.mean, dtype=np.float64),
            STATE_PREFIX + "obs_var": np.asarray(vecnorm.obs_rms.var, dtype=np.float64)}


def _device_of(policy: Any) -> Any:
    import torch

    return next((p.device for p in policy.parameters()), torch.device("cpu"))


def _indexed(device: Any) -> Any:
    """``device`` with the current CUDA device's index when it names none: a model's parameters
    report ``cuda:0``, and ``torch.device("cuda") != torch.device("cuda:0")`` (a CUDA model's
    shared policy was rebuilt beside it, each update a device-host-device round trip).

    >>> import torch
    >>> _indexed(torch.device("cpu"))
    device(type='cpu')
    """
    import torch

    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class ModelViews:
    """The model's tensors under ``prefix`` (from one ``state_dict()``) and, on the CPU, numpy
    views of them: publishing reads the live values with no copy and no module walk.

    :meth:`valid` says whether they are still the model's (the same policy object, the same
    storage: ``set_parameters`` and ``load_state_dict`` copy in place, a move or an assignment
    of ``.data`` gives new storage and the views are rebuilt). :meth:`token` changes when the
    values may have: torch bumps a tensor's version on every in-place write (optimizer steps,
    ``load_state_dict``), though not on writes through ``.data``, which SB3 makes only to
    target networks (never published).
    """

    generation = 0  # counts the views ever built: a token of new views never equals an old one

    def __init__(self, policy: Any, prefix: str):
        ModelViews.generation += 1
        self.generation = ModelViews.generation
        self.policy = policy
        # The live parameters and buffers, not state_dict's detached copies of them: an
        # assignment of .data changes the parameter's storage, never the detached tensor's.
        self.tensors = distinct_tensors((k, _live(policy, k, v)) for k, v in policy.state_dict().items()
                                        if k.startswith(prefix))
        self._live = [v for _, v in self.tensors]  # (read twice a collect: a flat list is the cheapest walk)
        self.ptrs = [v.data_ptr() for v in self._live]
        # Held, the storage seen here stays alive: new storage never gets one of these addresses.
        self._held = [v.detach() for _, v in self.tensors]
        self.views = ({k: v.detach().numpy() for k, v in self.tensors}
                      if all(v.device.type == "cpu" for _, v in self.tensors) else None)
        self._host: list[Any] | None = None  # off the CPU: host buffers the values are copied into

    def valid(self, policy: Any) -> bool:
        return policy is self.policy and [v.data_ptr() for v in self._live] == self.ptrs

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights: views of the live tensors on the CPU (as ``.numpy()`` gave before);
        elsewhere, host copies made now, in buffers the next call overwrites (a reader copies
        what it keeps, as it must from the live views: the executor's publish does)."""
        if self.views is not None:
            return dict(self.views)
        return self._to_host()

    def _to_host(self) -> dict[str, np.ndarray]:
        """One device-to-host copy per tensor per publish (not per replica), into buffers
        allocated once, pinned for CUDA tensors so the copies are queued together on the
        tensors' streams and waited for once (``.cpu()`` made a pageable buffer and waited
        for each tensor, every publish)."""
        import torch

        if self._host is None:
            pin = torch.cuda.is_available()
            self._host = [torch.empty(v.shape, dtype=v.dtype, pin_memory=pin and v.device.type == "cuda")
                          for _, v in self.tensors]
        streams = {}
        with torch.no_grad():
            for (_, v), h in zip(self.tensors, self._host):
                if v.device.type == "cuda" and h.is_pinned():
                    # Queued on the stream the training wrote on: the copy sees its last update.
                    stream = torch.cuda.current_stream(v.device)
                    streams[stream.cuda_stream, v.device.index] = stream
                    h.copy_(v.detach(), non_blocking=True)
                else:
                    h.copy_(v.detach())  # synchronous: done when it returns
        for stream in streams.values():
            stream.synchronize()  # the values are in the host buffers before anyone reads them
        return {k: h.numpy() for (k, _), h in zip(self.tensors, self._host)}

    def token(self) -> tuple:
        return self.generation, tuple([v._version for v in self._live])


def distinct_tensors(named: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Each tensor once, under its first name. A module registered under several names is in
    a ``state_dict`` once per name: SB3's shared features extractor is ``features_extractor``,
    ``pi_features_extractor`` and ``vf_features_extractor``, so a ``CnnPolicy``'s state holds
    the Nature CNN three times (5.1M values for 1.7M parameters), and each would be published,
    copied to the host and loaded into the same storage three times. ``named``: pairs whose
    values are the modules' own parameters and buffers (``state_dict(keep_vars=True)``, or
    :func:`_live`), so one tensor under two names is one object."""
    seen: set[int] = set()
    out = []
    for k, v in named:
        if id(v) not in seen:
            seen.add(id(v))
            out.append((k, v))
    return out


def _with_aliases(module: Any, weights: Mapping[str, Any]) -> dict[str, Any]:
    """``weights`` plus, for each name of ``module``'s state that ``weights`` lacks, the array
    of another name of the same tensor (the names :func:`distinct_tensors` dropped). A name
    with no such twin stays missing, for ``load_state_dict`` to report."""
    full = dict(weights)
    names: dict[int, list[str]] = {}
    for k, v in module.state_dict(keep_vars=True).items():
        names.setdefault(id(v), []).append(k)
    for group in names.values():
        given = next((k for k in group if k in weights), None)
        if given is not None:
            for k in group:
                full.setdefault(k, weights[given])
    return full


def _live(module: Any, name: str, fallback: Any) -> Any:
    """The parameter or buffer ``name`` of ``module`` itself (``fallback``: a state_dict entry
    that is neither, e.g. one a hook adds)."""
    for get in (module.get_parameter, module.get_buffer):
        try:
            return get(name)
        except AttributeError:
            pass
    return fallback
