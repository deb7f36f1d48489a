"""Faults: every failure surfaces as WorkerError with the child's traceback, and leaves no
process and no shared-memory segment (the autouse fixture in conftest checks both)."""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from auturi import AuturiError, Config, WorkerError, make_executor
from auturi.envs import FaultyEnv
from tests.conftest import our_segments
from tests.helpers import ObsHashPolicy, RaisingPolicy, SuicideEnv, WorkerOnlyFaultyEnv, run_probe_script

ENV_IN_WORKER = Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2)
ENV_IN_ACTOR = Config(num_actors=2, envs_per_actor=2)
REPLICAS = Config(num_actors=1, envs_per_actor=4, policies_per_actor=2, policy_batch_size=2)


def executor(env_fn, config, policy_cls=ObsHashPolicy):
    return make_executor(env_fn, policy_cls(env_fn().action_space), num_envs=4, config=config, backend="shm")


@pytest.mark.parametrize("config", [ENV_IN_WORKER, ENV_IN_ACTOR], ids=["env_worker", "actor"])
@pytest.mark.parametrize("where", ["step", "reset"])
def test_env_exception_surfaces_with_traceback(config, where):
    kw = {"fail_step": 5} if where == "step" else {"fail_reset": 2}  # reset 1 is the first one
    # fail only in worker processes: the actor steps one share of its envs in the caller
    env_fn = functools.partial(WorkerOnlyFaultyEnv, main_pid=os.getpid(), max_len=3, **kw)
    ex = executor(env_fn, config)
    with pytest.raises(WorkerError) as e:
        for _ in range(5):
            ex.collect(4)
    err = e.value
    assert f"FaultyEnv: {where}" in err.traceback and "RuntimeError" in err.traceback
    assert ("env worker" in err.worker) if config is ENV_IN_WORKER else err.worker.startswith("actor")
    assert err.config == config and str(config) in str(err)
    with pytest.raises(AuturiError, match="closed"):
        ex.collect(4)


def test_env_exception_in_serial_config_propagates_as_is():
    ex = executor(functools.partial(FaultyEnv, fail_step=2), Config.serial(4))
    with pytest.raises(RuntimeError, match="FaultyEnv: step"):
        ex.collect(4)


@pytest.mark.parametrize("config", [REPLICAS, Config(num_actors=2, envs_per_actor=2, policies_per_actor=2)],
                         ids=["replica", "replica_in_actor_process"])
def test_policy_exception_surfaces(config):
    env_fn = functools.partial(FaultyEnv)
    ex = executor(env_fn, config, RaisingPolicy)
    ex.collect(2)
    ex.set_policy_state({"w": np.array(1.0)})
    with pytest.raises(WorkerError) as e:
        ex.collect(2)
    assert "RaisingPolicy fails on purpose" in e.value.traceback
    assert "policy replica" in e.value.worker


@pytest.mark.parametrize("config", [ENV_IN_WORKER, ENV_IN_ACTOR], ids=["env_worker", "actor"])
def test_worker_killed_mid_collect(config):
    env_fn = functools.partial(SuicideEnv, kill_step=3, main_pid=os.getpid())
    ex = executor(env_fn, config)
    with pytest.raises(WorkerError, match="SIGKILL") as e:
        ex.collect(10)
    assert e.value.traceback == ""


def test_replica_killed_between_collects():
    ex = executor(functools.partial(FaultyEnv), REPLICAS)
    ex.collect(2)
    victim = next(s.proc for s in ex._slots if s.kind == "policy")
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match="policy replica 0.*SIGKILL"):
        ex.collect(2)


def test_bad_env_factory_fails_at_construction():
    def broken():
        raise OSError("simulator license not found")

    calls = []

    def sometimes_broken():  # the probe in the caller works, the workers' copies fail
        calls.append(1)
        if os.getpid() != main_pid:
            raise OSError("simulator license not found")
        return FaultyEnv()

    main_pid = os.getpid()
    with pytest.raises(OSError, match="license"):
        make_executor(broken, ObsHashPolicy(FaultyEnv().action_space), num_envs=2, backend="shm")
    with pytest.raises(WorkerError, match="license"):
        make_executor(sometimes_broken, ObsHashPolicy(FaultyEnv().action_space), num_envs=4, config=ENV_IN_WORKER,
                      backend="shm")


def test_close_is_idempotent_and_frees_everything():
    ex = executor(functools.partial(FaultyEnv), Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2,
                                                      policies_per_actor=2))
    ex.collect(3)
    pids = [s.proc.pid for s in ex._slots]
    assert len(pids) == 2 + 2 * (1 + 2)
    ex.close()
    ex.close()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


CTRL_C_SCRIPT = textwrap.dedent("""
    import functools, sys
    from auturi import Config, make_executor
    from auturi.envs import SlowEnv
    from tests.helpers import ObsHashPolicy
    env_fn = functools.partial(SlowEnv, step_seconds=0.01)
    cfg = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2)
    ex = make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=4, config=cfg, backend="shm")
    ex.collect(20)
    print(" ".join(str(s.proc.pid) for s in ex._slots), flush=True)
    print("collecting", flush=True)
    while True:
        ex.collect(20)
""")


def _descendants(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_leave_nothing_behind(sig):
    """Ctrl-C, or a plain ``kill``: no worker, forkserver or resource tracker outlives the
    script, no segment or named semaphore of its processes stays in /dev/shm, and nothing of
    its workers' shutdown is printed. Leftovers are told by the names, which carry the pid of
    the process that made them: another process's semaphore (made here while the script runs,
    as another session's run on this machine would) must not fail the test."""
    import _multiprocessing

    neighbour = f"/neighbour_{os.getpid()}_{sig.name}"
    # SIGINT back to its default in the script, as in a terminal: a shell starts background jobs
    # (`cmd &`, nohup, some CI runners) with SIGINT ignored, children inherit that, and Python
    # then never raises KeyboardInterrupt, so the script would run on forever.
    p = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=os.path.dirname(os.path.dirname(__file__)),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = [int(x) for x in p.stdout.readline().split()]
    assert p.stdout.readline().strip() == "collecting"  # the script is inside collect now
    pids += _descendants(p.pid)  # the forkservers and the resource tracker too
    _multiprocessing.SemLock(1, 0, 1, neighbour, False)  # kind, value, maxvalue, name, unlink: kept
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # SIGKILL: the script's workers then leave by themselves (they watch it, whoever their
        # parent is: processes.exit_with_owner), so a failed test leaves no collector running,
        # and the communicate() below ends (the workers hold the script's pipes until they exit)
        p.kill()
        p.communicate()
        raise
    finally:
        _multiprocessing.sem_unlink(neighbour)
    if sig == signal.SIGINT:
        assert p.returncode != 0 and "KeyboardInterrupt" in err
    else:
        assert p.returncode == 128 + signal.SIGTERM, err
    assert "SemLock" not in err and "FileNotFoundError" not in err and "Exception ignored" not in err, err
    deadline = time.monotonic() + 10  # the forkservers and the tracker end once their pipes' last holders are gone
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [q for q in pids if psutil.pid_exists(q) and psutil.Process(q).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    assert alive == [], f"orphans after {sig.name}: {alive}"
    assert our_segments(p.pid) == set(), "segments or named semaphores left behind"


NO_MAIN_GUARD = textwrap.dedent("""
    import functools, os
    from auturi import Config, make_executor
    from auturi.envs import CountingEnv
    from tests.helpers import ObsHashPolicy
    print(os.getpid(), flush=True)
    env_fn = functools.partial(CountingEnv)
    ex = make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=4,
                       config=Config(envs_per_actor=4, env_parallel_degree=2), backend="shm")
""")


def test_script_without_main_guard_runs_once_and_cleans_up(tmp_path):
    """Workers do not re-import the caller's ``__main__`` (env factories and policies travel
    cloudpickled), so a script without the guard is not re-run in every worker: it runs
    once, collects, and leaves no segment behind."""
    script = tmp_path / "noguard.py"
    script.write_text(NO_MAIN_GUARD + "print(ex.collect(3).observations.shape, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    pid = int(lines[0])
    assert lines[1] == "(3, 4, 4)" and sum(1 for ln in lines if ln.strip().isdigit()) == 1  # ran once
    assert our_segments(pid) == set()


def test_workers_do_not_import_the_callers_main_module(tmp_path):
    """A training script importing heavy modules at the top must not make every env worker
    import them (forkserver and spawn re-import ``__main__`` by default)."""
    main, workers = run_probe_script(tmp_path, """
        import functools, os, sys
        import xml.dom.minidom  # stands for torch or SB3, imported at the top of a training script
        from auturi import Config, make_executor
        from tests.helpers import ModuleProbeEnv, ObsHashPolicy

        if __name__ == "__main__":
            env_fn = functools.partial(ModuleProbeEnv, "xml.dom.minidom", sys.argv[1])
            ex = make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=4,
                               config=Config(envs_per_actor=4, env_parallel_degree=4), backend="shm")
            ex.collect(2)
            ex.close()
            print(os.getpid(), flush=True)
    """)
    assert main == "1" and len(workers) == 3  # the caller steps one share, 3 env workers the rest
    assert set(workers.values()) == {"0"}, workers


def test_env_workers_do_not_import_torch():
    """Env workers stay torch-free even when the policy is a torch network."""
    pytest.importorskip("torch")
    from auturi import TorchPolicy
    from auturi.nets import MLPActorCritic
    from tests.helpers import TorchProbeEnv

    policy = TorchPolicy(functools.partial(MLPActorCritic, 4, 3), TorchProbeEnv().action_space)
    cfg = Config(num_actors=1, envs_per_actor=4, env_parallel_degree=4, policies_per_actor=2, policy_batch_size=2)
    with make_executor(TorchProbeEnv, policy, num_envs=4, config=cfg, backend="shm") as ex:
        r = ex.collect(30)
    worker_infos = [i for i in r.final_infos.values() if i["pid"] != os.getpid()]
    assert worker_infos, "no episode ended in an env worker"
    assert not any(i["torch_loaded"] for i in worker_infos)
