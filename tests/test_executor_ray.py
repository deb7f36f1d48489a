"""The ``ray`` backend against a real Ray instance: two nodes on this machine (Ray's own
cluster utilities: conftest's ``ray_cluster``, which other modules share), with Ray settings
that notice a lost node and end a stopped actor sooner than Ray's defaults (conftest's
``FAST_FAILURE_DETECTION``).

The data contract (the serial rollout, bit for bit) on multi-actor layouts spread over both
nodes, across collects, a num_steps change, a weight update and a reconfigure; the failure
policy (an actor killed or raising mid-collect is a WorkerError, nothing hangs, nothing is
left behind); and the connection errors. Besides the conftest's checks (which see our
processes inside Ray actors, but not Ray's own daemons), every test checks that the
processes started inside Ray actors ended and their shared-memory segments are gone.
"""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest

from auturi import AuturiError, Config, ConfigError, WorkerError, make_executor
from tests.helpers import N, BlockingEnv, ObsHashPolicy, WorkerOnlyFaultyEnv, assert_same, counting, run

ray = pytest.importorskip("ray")

TRACKED: set[int] = set()  # pids of Ray actors and of every process they started
DEADLINE = 30.0


@pytest.fixture(scope="module", autouse=True)
def two_nodes(ray_cluster):
    """The suite's two-node test cluster (node_a, node_b; 8 CPUs each), connected for this module."""
    return ray_cluster


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _segments_of(pids: set[int]) -> list[str]:
    """Segments and named semaphores (``sem.auturi_<pid>_*``) made by processes ``pids``."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(("auturi_", "sem.auturi_")) and
            int(n.split("_")[1]) in pids]


@pytest.fixture(autouse=True)
def ray_actors_leave_nothing():
    """After each test: every tracked process has ended and left no segment (polled with a
    deadline: a killed actor's children notice their parent is gone within about a second)."""
    yield
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        left, segs = [p for p in TRACKED if _alive(p)], _segments_of(TRACKED)
        if not left and not segs:
            break
        time.sleep(0.1)
    assert not left, f"processes of Ray actors still running: {left}"
    assert not segs, f"segments of Ray actors left in /dev/shm: {segs}"


def track(ex) -> list[list[int]]:
    """Remember the executor's actors and the processes inside them; returns the latter."""
    kids = ray.get([a.handle.child_pids.remote() for a in ex._actors], timeout=DEADLINE)
    TRACKED.update(ex.actor_pids, *kids)
    return kids


def node_labels(ex) -> list[str]:
    """Which test node ("node_a" or "node_b") each actor runs on."""
    label = {n["NodeID"]: next(k for k in ("node_a", "node_b") if k in n["Resources"])
             for n in ray.nodes() if n["Alive"]}
    return [label[node] for node in ex.actor_nodes]


def ray_executor(env_fn, config, **kw):
    space = (env_fn[0] if isinstance(env_fn, list) else env_fn)().action_space
    ex = make_executor(env_fn, ObsHashPolicy(space), num_envs=N, config=config, backend="ray", seed=3, **kw)
    track(ex)
    return ex


@pytest.fixture(scope="module")
def serial_reference():
    return run("serial", Config.serial(N))


# ------------------------------------------------------------------------------ data
HYBRID = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1)
FOUR_ACTORS = Config(num_actors=4, envs_per_actor=1)


# The serial rollout over both nodes: HYBRID's by the next test, on the same executor as its
# weight update and reconfigure (whose FOUR_ACTORS actors it checks are spread over both nodes):
# it is also test_executor_contract's every-config and weight-update case of HYBRID on Ray;
# every other config's, FOUR_ACTORS' included, by test_executor_contract's ray cases, which run
# on this same two-node cluster (conftest's ray_cluster) with the same envs, seed and collects.


def test_num_steps_change_weight_update_and_reconfigure_across_nodes(serial_reference):
    """Over two nodes, HYBRID: three collects whose episodes end mid-rollout and continue
    (num_steps 7, 7, 5) give the serial rollout bit for bit, and so does the collect after a
    weight update, which reaches every actor's replicas from the first step; a reconfigure
    to new actors recreates the envs (next generation, new episodes; shm moves them live
    instead, so the rows after it differ from shm's by design)."""
    env_fn = counting()

    def script(ex):
        out = [ex.collect(s) for s in (7, 7, 5)]
        ex.set_policy_state({"w": np.array(1e6)})
        out.append(ex.collect(4))
        return out

    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, config=Config.serial(N),
                       backend="serial", seed=3) as ex:
        ref = script(ex)
    with ray_executor(env_fn, HYBRID) as ex:
        got = script(ex)
        nodes = node_labels(ex)
        ex.reconfigure(FOUR_ACTORS)
        track(ex)
        after = ex.collect(3)
        assert set(node_labels(ex)) == {"node_a", "node_b"}
    assert_same(got[:3], serial_reference)
    assert_same(got, ref)
    assert len(nodes) == HYBRID.num_actors and set(nodes) == {"node_a", "node_b"}  # spread over both nodes
    # every env (so every replica of every actor) saw the new weight from the first step on
    assert all((r.extras["values"] < 1e5).all() for r in got[:3]) and (got[3].extras["values"] > 1e5).all()
    assert after.episode_starts[0].all()  # the envs were recreated: new episodes
    assert not np.array_equal(after.observations[0], got[3].last_observations)
    assert (after.extras["values"] > 1e5).all()  # the new actors start with the current weights


def test_a_reconfigure_that_keeps_each_actors_envs_and_bundle_keeps_the_ray_actors():
    """policy_batch_size 1 -> 2 changes no actor's envs nor bundle: the Ray actors (and the
    processes inside them) stay, their own executors reconfigure in place, the episodes go on
    and the data equals the serial run's across it; ``last_reconfigure`` says so. A degree
    change (bigger bundles) then restarts every actor: Ray cannot resize a bundle under a
    running actor."""
    env_fn = counting(max_len=50)
    first = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1)
    ref = run("serial", Config.serial(N), env_fn=env_fn, steps=(5, 7))
    with ray_executor(env_fn, first) as ex:
        got = [ex.collect(5)]
        pids, inside = ex.actor_pids, track(ex)
        ex.reconfigure(first.replace(policy_batch_size=2))
        assert ex.actor_pids == pids and track(ex) == inside
        assert ex.last_reconfigure["kept"] == ex.config.num_processes == 8
        assert ex.last_reconfigure["started"] == ex.last_reconfigure["ended"] == 0
        assert ex.last_reconfigure["recreated"] == 0
        got.append(ex.collect(7))
        ex.reconfigure(Config(num_actors=2, envs_per_actor=2, policies_per_actor=2, policy_batch_size=1))
        track(ex)
        assert not set(ex.actor_pids) & set(pids)
        assert ex.last_reconfigure["kept"] == 0 and ex.last_reconfigure["ended"] == 8
        assert ex.last_reconfigure["started"] == 6 and ex.last_reconfigure["recreated"] == N
    assert_same(got, ref)


# ------------------------------------------------------------------------------ faults
def test_killing_a_ray_actor_mid_collect_is_a_worker_error_and_leaves_nothing(tmp_path):
    """Env 1 blocks in actor 0's env worker, env 2 in actor 1's own process; actor 1 is
    killed from outside while both block. The collect raises WorkerError naming actor 1 and
    its node; closing aborts actor 0's blocked collect; every process inside both ends."""
    os.mkfifo(tmp_path / "fifo")
    plain = counting()
    blocking = functools.partial(BlockingEnv, str(tmp_path), 3, os.getpid())
    config = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)
    ex = ray_executor([plain, blocking, blocking, plain], config)
    victim = ex._actors[1]
    inside = track(ex)
    assert len(inside[0]) >= 1  # actor 0 runs an env worker (and multiprocessing's helpers)

    def kill_when_blocked():
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and str(victim.pid) not in os.listdir(tmp_path):
            time.sleep(0.05)
        ray.kill(victim.handle)

    killer = threading.Thread(target=kill_when_blocked, daemon=True)
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as e:
        ex.collect(10)
    killer.join(DEADLINE)
    assert time.monotonic() - t0 < 2 * DEADLINE  # bounded, not a hang (a generous bound)
    err = e.value
    assert err.worker.startswith("ray actor 1 (envs 2-3)") and victim.node[:12] in err.worker
    assert "died" in err.reason and err.config == config
    assert len([n for n in os.listdir(tmp_path) if n.isdigit()]) == 2  # both envs really blocked
    with pytest.raises(AuturiError, match="closed"):
        ex.collect(2)


NODE_LOSS_SECONDS = 90.0  # Ray's own detection of a lost node, on a busy 2-core machine


def test_a_node_lost_mid_collect_is_a_worker_error_naming_it_and_the_fix(tmp_path, two_nodes):
    """A third node joins; both actors of the layout are pinned to it (a custom resource only
    it has). While env 2 blocks inside actor 1 mid-collect, the node is removed (its raylet and
    every process on it killed, as when a machine is lost). The collect raises, within a
    bounded time, a WorkerError naming the actor, the lost node and what to do; close() then
    ends every process of both actors and leaves no shared memory."""
    node = two_nodes.add_node(num_cpus=4, resources={"node_c": 1}, object_store_memory=80 * 2**20)
    two_nodes.wait_for_nodes()
    os.mkfifo(tmp_path / "fifo")
    blocking = functools.partial(BlockingEnv, str(tmp_path), 3, os.getpid())
    plain = counting()
    config = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)
    ex = ray_executor([plain, plain, blocking, plain], config, actor_resources={"node_c": 0.5})
    try:
        assert set(ex.actor_nodes) == {node.node_id}
        victim = ex._actors[1]

        def remove_when_blocked():
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline and not [n for n in os.listdir(tmp_path) if n.isdigit()]:
                time.sleep(0.05)
            two_nodes.remove_node(node, allow_graceful=False)

        remover = threading.Thread(target=remove_when_blocked, daemon=True)
        remover.start()
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as e:
            ex.collect(10)
        took = time.monotonic() - t0
        remover.join(DEADLINE)
        assert not remover.is_alive()
        assert took < NODE_LOSS_SECONDS, f"the lost node was noticed after {took:.0f} s"
        err = e.value
        assert err.worker.startswith("ray actor ") and node.node_id[:12] in err.worker, err
        assert f"node {node.node_id}" in err.reason and "was lost" in err.reason, err.reason
        assert "restart" in err.reason and "auturi.wrap" in err.reason, err.reason  # the fix
        assert err.config == config
        with pytest.raises(AuturiError, match="closed"):
            ex.collect(2)
    finally:
        ex.close()
        if node in two_nodes.worker_nodes:
            two_nodes.remove_node(node)
    assert victim.pid in TRACKED  # the autouse fixture checks these processes ended, segments gone


def test_a_stopped_ray_actor_is_a_worker_error_naming_it():
    """worker_timeout holds for Ray actors too: a SIGSTOPped actor answers no progress probe."""
    config = Config(num_actors=2, envs_per_actor=2)
    ex = ray_executor(counting(), config, worker_timeout=2.0)
    ex.collect(3)
    victim = ex._actors[1]
    os.kill(victim.pid, signal.SIGSTOP)
    with pytest.raises(WorkerError) as e:
        ex.collect(5)
    err = e.value
    assert err.worker == victim.name and err.config == config
    assert "made no progress" in err.reason and "stopped (SIGSTOP" in err.reason


def test_an_env_step_that_never_returns_inside_a_ray_actor_names_its_env_worker(tmp_path):
    """The innermost stuck process is named: the env worker inside the actor, with its stack."""
    os.mkfifo(tmp_path / "fifo")
    blocking = functools.partial(BlockingEnv, str(tmp_path), 3, os.getpid())
    plain = counting()
    config = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)
    ex = ray_executor([plain, blocking, plain, plain], config, worker_timeout=2.0)  # env 1: actor 0's worker
    with pytest.raises(WorkerError) as e:
        ex.collect(10)
    err = e.value
    assert err.worker.startswith(ex_name := "ray actor 0 (envs 0-1)") and ": env worker 1 of actor 0" in err.worker
    assert "made no progress" in err.reason and err.config == config, ex_name
    assert "helpers.py" in err.stack and "in step" in err.stack


def test_env_exception_in_a_ray_actor_carries_the_remote_traceback():
    env_fn = functools.partial(WorkerOnlyFaultyEnv, main_pid=os.getpid(), fail_step=4)
    config = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)
    ex = ray_executor(env_fn, config)
    with pytest.raises(WorkerError) as e:
        ex.collect(6)
    err = e.value
    assert err.worker.startswith("ray actor") and "on node" in err.worker
    assert "FaultyEnv: step 4 fails on purpose" in err.traceback and err.config == config
    with pytest.raises(AuturiError, match="closed"):
        ex.collect(2)


def test_a_config_no_node_can_hold_is_a_config_error():
    env_fn = counting()
    with pytest.raises(ConfigError, match="largest node has 8 CPUs"):
        make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=16, backend="ray",
                      config=Config(num_actors=1, envs_per_actor=16, env_parallel_degree=16))
    with pytest.raises(ConfigError, match="no GPU in the Ray cluster"):
        make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, backend="ray",
                      config=Config(num_actors=2, envs_per_actor=2, policy_device="cuda"))


# ------------------------------------------------------------------------------ connecting
def test_a_second_cluster_address_in_one_process_is_refused():
    env_fn = counting()
    with pytest.raises(AuturiError, match="already connected"):
        make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, backend="ray",
                      address="127.0.0.1:1")


def test_a_cluster_refusing_our_credentials_says_token_auth_and_the_fix(monkeypatch):
    """What ray.init raises, after ~20 s of retries, for a driver without token auth against
    a `ray start` cluster with it (seen on a real cluster: a ConnectionError whose cause
    carries InvalidAuthToken): the error names the cause and both fixes, not `ray start`."""
    from auturi.executor.ray import cluster as ray_cluster

    def refused(**kwargs):
        try:
            raise RuntimeError("Failed to connect to GCS. ray.exceptions.AuthenticationError: RPC error: "
                               "InvalidAuthToken: Authentication token is missing or incorrect.")
        except RuntimeError as exc:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from exc

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(ray_cluster, "_check_reachable", lambda address: None)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(AuturiError) as e:
        ray_cluster.connect("10.0.0.1:6379")
    msg = str(e.value)
    assert "address='10.0.0.1:6379' refused this process's credentials" in msg and "RAY_AUTH_MODE here: unset" in msg
    assert "RAY_AUTH_MODE=token" in msg and "RAY_AUTH_MODE=disabled" in msg and "ray start --head" not in msg


CONNECT_SCRIPT = textwrap.dedent("""
    import os, ray
    from auturi import AuturiError, Config, make_executor
    from auturi.envs import CountingEnv
    from tests.helpers import ObsHashPolicy
    os.environ.pop("RAY_ADDRESS", None)
    pol = ObsHashPolicy(CountingEnv().action_space)
    try:
        make_executor(CountingEnv, pol, num_envs=2, backend="ray", address="127.0.0.1:1")
    except AuturiError as e:
        print("ERROR:", str(e).replace("\\n", " "))
    print("initialized after the error:", ray.is_initialized())
    with make_executor(CountingEnv, pol, num_envs=2, backend="ray", config=Config(num_actors=2)) as ex:
        print("local:", ex.collect(3).observations.shape, ray.is_initialized())
    print("after close:", ray.is_initialized())
""")


def test_unreachable_address_then_a_local_instance_started_and_shut_down():
    """In a fresh process: an address nobody listens on fails at once, naming it and the
    fix; address=None then starts a local instance, which close() shuts down."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", CONNECT_SCRIPT], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ERROR:") and "'127.0.0.1:1'" in lines[0] and "ray start --head" in lines[0]
    assert "address=None" in lines[0]
    assert lines[1:] == ["initialized after the error: False", "local: (3, 2, 4) True", "after close: False"]


def test_the_ray_backend_without_ray_says_which_extra_to_install(monkeypatch):
    import importlib.util

    from auturi.executor import make_executor
    from auturi.envs import CountingEnv
    from auturi.policy import ConstantPolicy

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ImportError, match=r"auturi\[ray\]"):
        make_executor([CountingEnv] * 2, ConstantPolicy(CountingEnv().action_space), num_envs=2, backend="ray")
