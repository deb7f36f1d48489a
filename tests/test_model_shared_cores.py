"""The model's lockstep row with more env lanes than cores (``tuner/model.py``,
``_pipeline_row``): the lanes pinned to one core take turns with their steps' CPU, and the
cores stay idle while the row's batch is on the device. Deterministic: synthetic profiles and
the GPU box record's figures (``tests/test_tuner_gpu_model.py``), no executor."""
from __future__ import annotations

import pytest

from auturi import Config
from auturi.tuner.profile import Profile, predict
from tests.test_tuner_gpu_model import GPU_BOX, MEASURED

CPU_ENV = Profile(env_step_seconds=1e-3, env_step_std=0.0, env_cpu_fraction=1.0,
                  policy_seconds={"cuda": {8: 0.5e-3}}, policy_cpu_seconds={"cuda": {8: 0.05e-3}},
                  ipc_seconds=0.0, contention=0.0, cores=2, num_steps=0)
"""Envs of 1 ms of CPU, a 0.5 ms pass; no round trip and no time-slicing cost, so the row's
shape is all a prediction holds."""


@pytest.mark.parametrize("degree", [2, 4, 8])
def test_lanes_sharing_a_core_step_in_turn_and_the_cores_idle_during_the_pass(degree):
    """8 envs of 1 ms of CPU on 2 cores: each core steps 4 envs a row whatever the degree,
    then the batch's 0.5 ms pass, during which no lane has a step to take: 8 / 4.5 ms (the
    cap by the cores alone read 2 / 1 ms at degrees 4 and 8)."""
    c = Config(1, 8, degree, 1, "cuda", 8)
    assert predict(c, CPU_ENV) == pytest.approx(8 / 4.5e-3, rel=0.02)


def test_lanes_that_wait_inside_their_envs_do_not_take_turns():
    """The same envs waiting 95% of their step (a remote simulator): 8 lanes of one env on
    2 cores overlap their waits, so the row is one step and the pass, not four steps."""
    waits = CPU_ENV.replace(env_cpu_fraction=0.05)
    assert predict(Config(1, 8, 8, 1, "cuda", 8), waits) > 1.5 * predict(Config(1, 8, 8, 1, "cuda", 8), CPU_ENV)


def test_the_gpu_box_single_actor_lockstep_layout_reads_closer_from_the_profile_alone():
    """1 x 64 at degree 32 on 16 cores (two lanes a core): 32,971 steps/s predicted before
    this term (+165% over the measured 12,448); now within 1.8x of it."""
    c = Config(1, 64, 32, 1, "cuda", 64)
    assert predict(c, GPU_BOX) < 1.8 * MEASURED[c]
