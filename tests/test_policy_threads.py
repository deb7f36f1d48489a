"""The thread rule of in-process inference (``auturi/executor/policy_runner.py``): the
PolicyRunner calibrates the torch thread count once, applies it around each act and
restores the caller's count after; policies without torch are left alone. Timings come from
a fake clock, never from the machine."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import auturi
from auturi.envs import CountingEnv
from auturi.executor import policy_runner as pr

torch = pytest.importorskip("torch")


class SpyPolicy:
    """A torch-side policy that records the torch thread count each act ran with."""

    noise_dim = 0

    def __init__(self, action_space):
        self.space = action_space
        self.seen: list[int] = []

    def act(self, obs, noise):
        self.seen.append(torch.get_num_threads())
        return np.zeros(len(obs), np.int64), {}

    def get_state(self):
        return {}

    def load_state(self, state):
        pass

    def to(self, device):
        pass


@pytest.fixture
def caller_threads():
    """The test's own torch thread count (2), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def fake_clock_call(cost: dict[int, float]):
    """A call whose duration, on the returned fake clock, depends on the thread count."""
    now = [0.0]

    def clock():
        return now[0]

    def call():
        now[0] += cost[torch.get_num_threads()]

    return call, clock


def test_best_threads_keeps_more_threads_only_when_clearly_faster(caller_threads):
    call, clock = fake_clock_call({1: 1.0, 2: 0.5})
    assert pr.best_threads(call, [1, 2], clock=clock) == 2
    call, clock = fake_clock_call({1: 1.0, 2: 0.85})  # 15% faster: not worth a core
    assert pr.best_threads(call, [1, 2], clock=clock) == 1
    call, clock = fake_clock_call({1: 1.0, 2: 2.3})  # the 64x64 MLP on 2 cores
    assert pr.best_threads(call, [1, 2], clock=clock) == 1
    assert torch.get_num_threads() == caller_threads  # calibration restores the count too
    assert pr.best_threads(call, [1]) == 1


def test_the_chosen_count_is_applied_for_the_act_and_restored_after(caller_threads, monkeypatch):
    monkeypatch.setattr(pr, "best_threads", lambda call, candidates=None: 1)
    policy = SpyPolicy(gym.spaces.Discrete(2))
    runner = pr.PolicyRunner(policy)
    runner.bind({"obs": np.zeros((3, 4, 2), np.float32), "noise": np.zeros((3, 4, 0), np.float32),
                 "actions": np.zeros((3, 4), np.int64)})
    runner.act_slice(0, 0, 4)
    runner.act(np.array([1, 1]), np.array([0, 3]))
    assert runner.threads == 1 and policy.seen == [1, 1]
    assert torch.get_num_threads() == caller_threads


def test_a_serial_collect_runs_inference_at_the_chosen_count_and_restores_the_callers(caller_threads,
                                                                                     monkeypatch):
    calls = []

    def choose(call, candidates=None):
        calls.append(1)
        return 1

    monkeypatch.setattr(pr, "best_threads", choose)
    policy = SpyPolicy(gym.spaces.Discrete(3))
    with auturi.make_executor(CountingEnv, policy, 4, backend="serial") as ex:
        policy.seen.clear()  # making the executor probed the policy's output shapes once
        ex.collect(8)
        assert torch.get_num_threads() == caller_threads  # the learner's count is untouched
        assert set(policy.seen) == {1}  # every act ran at the chosen count, not the caller's 2
        ex.collect(8)
        assert len(calls) == 1  # calibrated once, not per collect
        ex.reconfigure(auturi.Config(num_actors=2, envs_per_actor=2))
        ex.collect(8)
        assert len(calls) == 2  # a new layout hands the policy other batches: calibrated again
    assert torch.get_num_threads() == caller_threads


def test_policies_without_torch_skip_calibration(caller_threads, monkeypatch):
    monkeypatch.setattr(pr, "best_threads", lambda *a, **k: pytest.fail("calibrated a torch-free policy"))
    policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    with auturi.make_executor(CountingEnv, policy, 4, backend="serial") as ex:
        ex.collect(4)
        assert ex._policy.threads is None  # type: ignore[attr-defined]
    assert torch.get_num_threads() == caller_threads


def test_calibration_compares_medians_not_the_luckiest_call(caller_threads):
    """Under contention a 2-thread call is sometimes fast and mostly slow: its best call
    would win, its median does not."""
    now, n2 = [0.0], [0]

    def call():
        if torch.get_num_threads() == 2:
            n2[0] += 1
            now[0] += 0.2 if n2[0] == 3 else 5.0  # one lucky call among slow ones
        else:
            now[0] += 1.0

    assert pr.best_threads(call, [1, 2], clock=lambda: now[0]) == 1
