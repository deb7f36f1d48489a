"""A replica of an SB3 on-policy network is built without SB3's orthogonal init (every weight
is loaded over it), and acts exactly as the model's own network."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from auturi.adapters.sb3.policy import policy_state
from auturi.adapters.sb3.wrap import _on_policy_adapter

sb3 = pytest.importorskip("stable_baselines3")


def _model(policy_kwargs=None):
    return sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, seed=0, device="cpu",
                   policy_kwargs=policy_kwargs or {})


def _adapter(model):
    return _on_policy_adapter(model, None, deterministic=False)  # as auturi.wrap builds it


@pytest.mark.parametrize("policy_kwargs", [None, {"ortho_init": True}])
def test_the_replica_skips_the_orthogonal_init_and_acts_as_the_model(monkeypatch, policy_kwargs):
    model = _model(policy_kwargs)
    adapter = _adapter(model)

    def no_qr(*a, **k):
        raise AssertionError("the replica ran SB3's orthogonal init")

    monkeypatch.setattr(torch.nn.init, "orthogonal_", no_qr)
    adapter.load_state(policy_state(model, None))  # builds the network, then loads every weight
    net_state, model_state = adapter.net.state_dict(), model.policy.state_dict()
    assert net_state.keys() == model_state.keys()
    for k, v in model_state.items():
        torch.testing.assert_close(net_state[k], v, rtol=0, atol=0)
    obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    noise = np.random.default_rng(1).random((5, adapter.noise_dim))
    monkeypatch.undo()
    twin = _adapter(model)
    twin.share(model.policy)  # acts with the model's own network
    a, ex = adapter.act(obs, noise)
    b, ey = twin.act(obs, noise)
    np.testing.assert_array_equal(a, b)
    for k in ex:
        np.testing.assert_array_equal(ex[k], ey[k])
