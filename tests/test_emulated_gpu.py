"""The emulated GPU box (``auturi.testing``): seeded, layout-independent step times; a device
whose forward pass waits without CPU and whose start cost is paid once per process; and an
emulation no user selects by accident. No assertion here times anything: waits are checked
by what was drawn, CPU by ``time.process_time`` against the planned wait."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from auturi import Config, ConfigError, make_executor
from auturi.testing.emulated_gpu import (
    EMULATED_GPU_NAME,
    EmulatedDevicePolicy,
    context_payments,
    emulated_gpu,
    emulated_gpu_count,
)
from auturi.testing.emulated_sim import PROFILES, EmulatedSimEnv, SimCores, _open_pool
from tests.helpers import assert_same

FAST = 0.02  # time scale: every emulated wait 50x shorter, so the tests stay fast
N = 4


def _cuda_present() -> bool:
    from auturi.resources import cuda_device_count

    return cuda_device_count() > 0


# ---------------------------------------------------------------------------- step times
def test_step_times_depend_only_on_the_seed_and_the_step():
    scale = 1e-6  # draws scaled to nanoseconds: nothing is slept
    env = EmulatedSimEnv("pong-like", time_scale=scale, episode_steps=(5, 9))
    env.reset(seed=7)
    walked = []
    for t in range(600):  # crosses blocks of draws and dozens of episodes, the actions varying
        _, _, term, trunc, _ = env.step(t % 6)
        walked.append(env.last_step_seconds / scale)
        if term or trunc:
            env.reset()
    fresh = EmulatedSimEnv("pong-like").seeded(7)  # never stepped, default episodes
    drawn = [fresh.step_seconds_at(k) for k in range(600)]
    assert walked == pytest.approx(drawn, rel=1e-9)  # episodes, actions and history do not matter
    assert drawn != [EmulatedSimEnv("pong-like").seeded(8).step_seconds_at(k) for k in range(600)]


@pytest.mark.parametrize("name", list(PROFILES))
def test_profiles_draw_their_documented_spread(name):
    p = PROFILES[name]
    env = EmulatedSimEnv(name).seeded(0)
    waits = np.array([env.step_seconds_at(k) for k in range(20_000)])
    p_slow = p.straggler_prob
    assert waits.mean() == pytest.approx(p.step_seconds * (1 - p_slow + p_slow * p.straggler_factor), rel=0.05)
    stragglers = (waits > 3.5 * p.step_seconds).mean()  # the body almost never reaches 3.5x its mean
    assert 0.4 * p.straggler_prob < stragglers < 2.0 * p.straggler_prob


def test_serial_and_shm_layouts_collect_the_same_data():
    """The contract on the emulated box: cuda replicas, env workers and a shared pool of
    simulator cores give the serial rollout, bit for bit (episodes end mid-rollout)."""
    with emulated_gpu(), SimCores(2) as pool:
        env = functools.partial(EmulatedSimEnv, "straggler", time_scale=FAST, sim_cores=pool.name,
                                episode_steps=(6, 14))
        policy = EmulatedDevicePolicy(time_scale=FAST, context_seconds=0.01)
        runs = {}
        for name, backend, config in [("serial", "serial", Config.serial(N, "cuda")),
                                      ("workers+replicas", "shm", Config(1, N, 2, 2, "cuda", 2)),
                                      ("two actors", "shm", Config(2, N // 2, 2, 1, "cuda", N // 2))]:
            with make_executor(env, policy, num_envs=N, config=config, backend=backend, seed=5) as ex:
                runs[name] = [ex.collect(s) for s in (20, 11)]
    assert sum(len(r.final_observations) for r in runs["serial"]) >= N  # episodes ended and went on
    assert runs["serial"][0].observations.shape == (20, N, 4, 84, 84)
    assert_same(runs["workers+replicas"], runs["serial"])
    assert_same(runs["two actors"], runs["serial"])


# ---------------------------------------------------------------------------- the device
def test_device_forward_grows_with_the_batch_and_uses_little_cpu():
    p = EmulatedDevicePolicy(time_scale=20.0, context_seconds=0.0)
    p.to("cuda")
    sizes = [1, 8, 64]
    planned = [p.forward_seconds(b) for b in sizes]
    assert planned == sorted(planned) and planned[0] < planned[-1]
    assert p.forward_seconds(64, "cpu") > p.forward_seconds(64, "cuda")  # the CPU is the slower device
    obs = np.zeros((64, 4, 84, 84), np.uint8)
    noise = np.full((64, 1), 0.5, np.float32)
    calls = 5
    c0 = time.process_time()
    for _ in range(calls):
        p.act(obs, noise)
    cpu = time.process_time() - c0
    assert cpu < 0.25 * calls * planned[-1], (cpu, planned[-1])  # the device waits; the caller computes little


def test_the_start_cost_is_paid_once_per_process():
    a = EmulatedDevicePolicy(context_seconds=0.01, time_scale=FAST, report_process=True)
    b = EmulatedDevicePolicy(context_seconds=0.01, time_scale=FAST)
    a.to("cuda")
    b.to("cuda")
    a.act(np.zeros((2, 4, 84, 84), np.uint8), np.zeros((2, 1), np.float32))
    assert context_payments() == 1  # two policies, several calls: one start in this process
    assert EmulatedDevicePolicy(context_seconds=0.01).forward_seconds(1, "cpu") > 0
    with emulated_gpu():
        env = functools.partial(EmulatedSimEnv, time_scale=FAST)
        cfg = Config(1, N, 1, 2, "cuda", 1)  # two replica processes
        with make_executor(env, a, num_envs=N, config=cfg, backend="shm", seed=0) as ex:
            r1, r2 = ex.collect(4), ex.collect(4)
    pids = set(np.concatenate([r1.extras["device_pid"], r2.extras["device_pid"]]).ravel().tolist())
    assert len(pids) == 2 and os.getpid() not in pids  # the replicas ran every row
    assert set(r1.extras["context_payments"].ravel().tolist()) == {1}  # each replica started once...
    assert set(r2.extras["context_payments"].ravel().tolist()) == {1}  # ...and not again on later calls


def test_a_process_on_the_cpu_pays_no_start_cost():
    code = ("from auturi.testing.emulated_gpu import EmulatedDevicePolicy, context_payments\n"
            "import numpy as np\n"
            "p = EmulatedDevicePolicy(context_seconds=5.0, time_scale=0.01)\n"
            "p.to('cpu'); p.act(np.zeros((1, 4, 84, 84), np.uint8), np.zeros((1, 1), np.float32))\n"
            "print(context_payments())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "0"


# ---------------------------------------------------------------------------- no path by accident
@pytest.mark.skipif(_cuda_present(), reason="a real CUDA device accepts policy_device='cuda' without the emulation")
def test_cuda_is_refused_outside_the_emulation():
    from auturi.tuner.cache import hardware_fingerprint
    from auturi.tuner.space import available_devices

    env = functools.partial(EmulatedSimEnv, time_scale=FAST)
    policy = EmulatedDevicePolicy(time_scale=FAST, context_seconds=0.0)
    cuda = Config(1, N, 1, 1, "cuda", N)
    with pytest.raises(ConfigError, match="policy_device"):
        make_executor(env, policy, num_envs=N, config=cuda, backend="serial")
    assert available_devices() == ["cpu"]
    with emulated_gpu():
        assert emulated_gpu_count() == 1 and available_devices() == ["cpu", "cuda"]
        assert EMULATED_GPU_NAME in hardware_fingerprint()["gpus"]  # a cached record names the emulation
        with make_executor(env, policy, num_envs=N, config=cuda, backend="serial") as ex:
            assert ex.collect(2).num_steps == 2
    assert emulated_gpu_count() == 0 and available_devices() == ["cpu"]
    assert EMULATED_GPU_NAME not in hardware_fingerprint()["gpus"]
    with pytest.raises(ConfigError, match="policy_device"):
        make_executor(env, policy, num_envs=N, config=cuda, backend="serial")


def test_importing_auturi_leaves_the_emulation_unimported():
    code = ("import sys, gymnasium as gym, auturi, auturi.envs, auturi.executor, auturi.tuner\n"
            "assert 'auturi/EmulatedSim-v0' in gym.registry\n"
            "print(sorted(m for m in sys.modules if m.startswith('auturi.testing')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- simulator cores
def test_a_step_waits_for_a_free_simulator_core():
    with SimCores(1) as pool:
        env = EmulatedSimEnv("pong-like", time_scale=FAST, sim_cores=pool.name)
        env.reset(seed=0)
        core = _open_pool(pool.name)  # the pool as another process would open it
        core.acquire()  # the only core is taken
        done = threading.Event()
        stepper = threading.Thread(target=lambda: (env.step(0), done.set()))
        stepper.start()
        stepper.join(0.2)
        blocked = not done.is_set()  # a step never finishes while no core is free
        core.release()
        stepper.join(30)
        assert blocked and done.is_set()
        assert core.acquire(False)  # the step gave its core back
        core.release()
    closed = EmulatedSimEnv("pong-like", sim_cores=pool.name)
    with pytest.raises(RuntimeError, match="SimCores"):
        closed.reset(seed=0)
    assert not os.path.exists("/dev/shm/sem." + pool.name[1:])


# ---------------------------------------------------------------------------- the bench section
def test_the_bench_section_runs_every_system_at_its_smallest(tmp_path):
    """``python -m bench.emulated_gpu --smoke``: the shape of its record only (never a timing)."""
    pytest.importorskip("stable_baselines3")
    from bench.emulated_gpu import main

    out = main(["--smoke", "--profiles", "straggler", "--out", str(tmp_path / "emu.json")])
    (row,) = out["profiles"]
    assert {"envs_only", "sb3_subproc", "auturi_serial"} <= set(row["peers"])
    assert any(k.endswith("_2rep") for k in row["peers"])  # replicas on the emulated device
    for name, s in row["peers"].items():
        assert s["n"] == 1 and s["median"] > 0, name
    assert row["vs_envs_only"]["envs_only"] == 1.0 and row["vs_sb3_subproc"]["sb3_subproc"] == 1.0
    assert (tmp_path / "emu.json").exists()
