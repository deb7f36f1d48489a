"""The weights path, from the trainer's tensors to every replica's parameters (issue 32, item 2):
a replica loads straight from the shared weights block into its parameters (no private host
copy first), a replica whose version is current loads nothing, a policy that keeps what it
loads still gets private copies, and weights published mid-run reach every replica bit for
bit (serial, shm with two policy workers, shm with two actors, and the caller's own policy
after a reconfigure). The CUDA test runs where a GPU is and is skipped otherwise."""
from __future__ import annotations

import os
import tracemalloc
import zlib

import gymnasium as gym
import numpy as np
import pytest
import torch

from auturi import Config, make_executor
from auturi.envs import CountingEnv
from auturi.executor.buffers import ArrayBlock, MappedWeights, WeightsBlock
from auturi.executor.policy_runner import PolicyRunner
from auturi.executor.shm.channel import WEIGHTS_VERSION, control_specs, write_name
from auturi.executor.shm.worker import sync_policy_weights
from auturi.nets import MLPActorCritic
from auturi.policy import TorchPolicy


def small_mlp() -> MLPActorCritic:
    return MLPActorCritic(4, 3, hidden=32)


def wide_mlp() -> MLPActorCritic:
    return MLPActorCritic(4, 3, hidden=256)  # ~135k parameters, 0.5 MB: a copy of it is plain to see


def digest(state) -> float:
    """A CRC of every value's bytes, in key order (exact in a float64: CRCs are < 2**32)."""
    crc = 0
    for k, v in state.items():
        a = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        crc = zlib.crc32(k.encode() + np.ascontiguousarray(a).tobytes(), crc)
    return float(crc)


class DigestPolicy(TorchPolicy):
    """A TorchPolicy whose extras say which weights acted (``digest``) and where (``pid``)."""

    def __init__(self):
        super().__init__(small_mlp, gym.spaces.Discrete(3))

    def act(self, obs, noise):
        actions, extras = super().act(obs, noise)
        n = len(obs)
        extras["digest"] = np.full(n, digest(self.model.state_dict()), np.float64)
        extras["pid"] = np.full(n, os.getpid(), np.float64)
        return actions, extras


class KeepingPolicy:
    """Keeps the arrays ``load_state`` gets (the protocol allows it: it does not say
    ``load_state_copies``)."""

    noise_dim = 0

    def __init__(self):
        self.state = {}

    def load_state(self, state):
        self.state = dict(state)


def _state_of(module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _randomized(module, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return module


def _mapping_range(mapped: MappedWeights) -> tuple[int, int]:
    raw = np.frombuffer(mapped._shm.buf, np.uint8)  # type: ignore[union-attr]
    lo = raw.__array_interface__["data"][0]
    size = raw.nbytes
    del raw  # no view may outlive the test (the mapping's close would refuse)
    return lo, lo + size


def _sb3_adapter():
    from stable_baselines3 import PPO

    from auturi.adapters.sb3.wrap import _on_policy_adapter

    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [256, 256]}, device="cpu", seed=0)
    return model, _on_policy_adapter(model, None, deterministic=False)


@pytest.mark.parametrize("kind", ["torch", "sb3"])
def test_replica_loads_straight_from_the_block(kind, monkeypatch):
    """Each parameter is copied once, from the replica's mapping of the block into the
    parameter's own storage; numpy allocates no copy of the state on the way (the old path
    copied the whole block out first: a peak of the state's size)."""
    if kind == "torch":
        policy = TorchPolicy(wide_mlp, gym.spaces.Discrete(3))
        module = policy.model
        published = _state_of(_randomized(wide_mlp(), 1))
    else:
        model, policy = _sb3_adapter()
        module = policy.net
        published = {k: v.detach().numpy() + np.float32(0.5) for k, v in model.policy.state_dict().items()}
    state_bytes = sum(v.nbytes for v in published.values())
    assert state_bytes > 400_000
    runner = PolicyRunner(policy)
    block = WeightsBlock.write(published, None)
    try:
        runner.load_published(block.name, 1)  # the first load (SB3: load_state_dict, then slots)
        second = {k: v * np.float32(-2) for k, v in published.items()}
        assert WeightsBlock.write(second, block) is block  # same layout: rewritten in place
        ptrs = {k: v.data_ptr() for k, v in module.state_dict().items()}
        copies = []
        own_copy = torch.Tensor.copy_

        def spy(dst, src, *args, **kwargs):
            copies.append((dst.data_ptr(), src.data_ptr()))
            return own_copy(dst, src, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "copy_", spy)
        tracemalloc.start()
        try:
            runner.load_published(block.name, 2)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        monkeypatch.undo()
        assert runner.weights_version == 2
        assert peak < state_bytes / 4, f"a load allocated {peak} bytes for a {state_bytes}-byte state"
        lo, hi = _mapping_range(runner._mapped)
        assert len(copies) == len(second)  # one copy per tensor, no other
        assert all(lo <= src < hi for _, src in copies)  # each from the block itself
        assert sorted(dst for dst, _ in copies) == sorted(ptrs.values())  # into the parameters
        got = module.state_dict()
        assert {k: v.data_ptr() for k, v in got.items()} == ptrs  # in place: the same storage
        for k, v in second.items():
            np.testing.assert_array_equal(got[k].numpy(), v, strict=True)
    finally:
        runner._mapped.close()
        block.close()


def test_a_shared_features_extractor_travels_once():
    """SB3's CnnPolicy holds its Nature CNN under three names (features_extractor,
    pi_features_extractor, vf_features_extractor): the published state has it once, and a
    replica loading that state holds the trainer's every tensor, under every name, bit for bit."""
    from types import SimpleNamespace

    from stable_baselines3.common.policies import ActorCriticCnnPolicy

    from auturi.adapters.sb3.policy import SB3PolicyAdapter

    obs, act = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)
    trainer = ActorCriticCnnPolicy(obs, act, lambda _: 3e-4)
    full = trainer.state_dict()
    assert len(full) > len({v.data_ptr() for v in full.values()})  # the aliases this is about
    replica = SB3PolicyAdapter(ActorCriticCnnPolicy, obs, act, {}, "CategoricalDistribution")
    for seed in (5, 6):  # the first load (load_state_dict), then the in-place one
        _randomized(trainer, seed)
        state = replica.state_of(SimpleNamespace(policy=trainer), None)
        assert sum(v.size for v in state.values()) == sum(p.numel() for p in trainer.parameters())
        assert not any(k.startswith(("pi_features_extractor.", "vf_features_extractor.")) for k in state)
        block = WeightsBlock.write(state, None)
        runner = PolicyRunner(replica, calibrate=False)
        try:
            runner.load_published(block.name, seed)
        finally:
            runner._mapped.close()
            block.close()
        got = replica.net.state_dict()
        assert got.keys() == full.keys()
        for k, v in trainer.state_dict().items():
            np.testing.assert_array_equal(got[k].numpy(), v.numpy(), strict=True)
    # get_state (the executor's first block) has each tensor once too, and loads back.
    again = SB3PolicyAdapter(ActorCriticCnnPolicy, obs, act, {}, "CategoricalDistribution")
    again.load_state(replica.get_state())
    for k, v in again.net.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), got[k].numpy(), strict=True)


def test_a_policy_that_keeps_its_state_gets_private_copies():
    policy = KeepingPolicy()
    runner = PolicyRunner(policy, calibrate=False)
    block = WeightsBlock.write({"w": np.arange(6, dtype=np.float32)}, None)
    try:
        runner.load_published(block.name, 1)
        kept = policy.state["w"]
        WeightsBlock.write({"w": np.full(6, 7, np.float32)}, block)  # the next publish, in place
        np.testing.assert_array_equal(kept, np.arange(6, dtype=np.float32))  # untouched: a copy
        runner.load_published(block.name, 2)
        np.testing.assert_array_equal(policy.state["w"], np.full(6, 7, np.float32))
    finally:
        runner._mapped.close()
        block.close()


def test_a_replica_whose_version_is_current_loads_nothing(monkeypatch):
    loads = []
    own = MappedWeights.load_into
    monkeypatch.setattr(MappedWeights, "load_into", lambda self, policy: (loads.append(self.name), own(self, policy)))
    policy = KeepingPolicy()
    runner = PolicyRunner(policy, calibrate=False)
    ctrl = ArrayBlock.create(control_specs(4, 4), shared=False)
    block = WeightsBlock.write({"w": np.ones(3, np.float32)}, None)
    try:
        sync_policy_weights(runner, ctrl)  # version 0, no block named yet: nothing to load
        assert loads == [] and runner.weights_version == 0
        write_name(ctrl, 1, block.name)
        ctrl["hdr"][WEIGHTS_VERSION] = 1
        for _ in range(3):  # every task syncs; only the first sees a new version
            sync_policy_weights(runner, ctrl)
        assert loads == [block.name] and runner.weights_version == 1
        WeightsBlock.write({"w": np.full(3, 2, np.float32)}, block)
        ctrl["hdr"][WEIGHTS_VERSION] = 2
        sync_policy_weights(runner, ctrl)
        sync_policy_weights(runner, ctrl)
        assert loads == [block.name] * 2 and runner.weights_version == 2
        np.testing.assert_array_equal(policy.state["w"], np.full(3, 2, np.float32))
        # A block of a new layout has a new name: the old mapping is dropped, the new one kept.
        old = runner._mapped
        bigger = WeightsBlock.write({"w": np.ones(5, np.float32)}, block)
        block = bigger
        write_name(ctrl, 1, bigger.name)
        ctrl["hdr"][WEIGHTS_VERSION] = 3
        sync_policy_weights(runner, ctrl)
        assert runner._mapped is not old and old._shm is None and runner._mapped.name == bigger.name
        np.testing.assert_array_equal(policy.state["w"], np.ones(5, np.float32))
    finally:
        if runner._mapped is not None:
            runner._mapped.close()
        block.close()
        ctrl.close()


CONFIGS = {
    "serial": ("serial", Config.serial(4)),
    "shm-2-policy-workers": ("shm", Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2,
                                           policies_per_actor=2, policy_batch_size=2)),
    "shm-2-actors": ("shm", Config(num_actors=2, envs_per_actor=2, env_parallel_degree=1)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_weights_published_mid_run_reach_every_replica_bit_for_bit(name):
    backend, cfg = CONFIGS[name]
    policy = DigestPolicy()
    start = digest(policy.model.state_dict())
    trainer = _randomized(small_mlp(), 2)
    with make_executor(CountingEnv, policy, num_envs=4, config=cfg, backend=backend, seed=0) as ex:
        first = ex.collect(3)
        # The trainer's own parameters (they require grad), as a user's loop would pass them.
        ex.set_policy_state(dict(trainer.named_parameters()))
        second = ex.collect(3)
        new = digest(dict(trainer.named_parameters()))
        assert new != start
        assert (first.extras["digest"] == start).all()  # every replica started from the caller's weights
        assert (second.extras["digest"] == new).all()  # and every one acts with the new ones from row 0
        pids = set(second.extras["pid"].ravel().astype(int).tolist())
        if backend == "serial":
            assert pids == {os.getpid()}
        else:  # two replicas acted, each in its own process, each with the new weights
            assert len(pids) == 2 and os.getpid() not in pids
            # Published while the policy ran only in workers: the caller's copy missed it, and
            # loads it from the block when the policy comes back to the caller.
            trainer = _randomized(trainer, 3)
            ex.set_policy_state(_state_of(trainer))
            ex.reconfigure(Config.serial(4))
            third = ex.collect(2)
            assert (third.extras["digest"] == digest(trainer.state_dict())).all()
            assert set(third.extras["pid"].ravel().astype(int).tolist()) == {os.getpid()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_cuda_weights_come_to_the_host_once_into_kept_buffers_and_load_on_the_device():
    from auturi.adapters.sb3.policy import ModelViews

    module = _randomized(small_mlp(), 4).to("cuda")
    views = ModelViews(module, "")
    first = views.arrays()
    for k, v in module.state_dict().items():
        np.testing.assert_array_equal(first[k], v.cpu().numpy(), strict=True)
    ptrs = {k: a.__array_interface__["data"][0] for k, a in first.items()}
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(3)
    again = views.arrays()
    assert {k: a.__array_interface__["data"][0] for k, a in again.items()} == ptrs  # the same pinned buffers
    assert all(h.is_pinned() for h in views._host)
    for k, v in module.state_dict().items():
        np.testing.assert_array_equal(again[k], v.cpu().numpy(), strict=True)
    # A CUDA replica loads the block straight onto the device.
    replica = TorchPolicy(small_mlp, gym.spaces.Discrete(3), device="cuda")
    runner = PolicyRunner(replica, calibrate=False)
    block = WeightsBlock.write(again, None)
    try:
        runner.load_published(block.name, 1)
        for k, v in replica.model.state_dict().items():
            assert v.device.type == "cuda"
            np.testing.assert_array_equal(v.cpu().numpy(), again[k], strict=True)
    finally:
        runner._mapped.close()
        block.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_a_cuda_models_own_policy_stays_shared_when_the_replica_is_told_plain_cuda():
    """The face says ``policy_device="cuda"``; the model's parameters say ``cuda:0``: the
    caller's replica must keep acting with the model's own network (no copy, no round trip)."""
    from stable_baselines3 import PPO

    from auturi.adapters.sb3.wrap import _on_policy_adapter

    model = PPO("MlpPolicy", "CartPole-v1", device="cuda", n_steps=8)
    adapter = _on_policy_adapter(model, None, False)  # as auturi.wrap builds it
    adapter.share(model.policy)
    adapter.to("cuda")
    assert adapter.shared and adapter._net is model.policy
