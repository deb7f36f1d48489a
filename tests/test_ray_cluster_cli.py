"""A Ray cluster started the way users start one: ``ray start --head`` and a second
``ray start --address=...``, each a separate process (``--block``, so ending that process
ends its node's daemons), with bounded waits and torn down at the end. On it, in processes of
their own started together (``on_cluster``): ``auturi tune --backend ray --address ...`` (prints
where each actor ran), a wrapped RLlib PPO iteration, the error for a driver whose token-auth
mode differs from the cluster's. (The error for an address nobody listens on, the same command
with no cluster, is test_cli's test_worker_timeout_and_address_reach_the_executor.)"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

pytest.importorskip("ray")

START_SECONDS = 90.0  # each node's start (a busy 2-core machine)
RUN_SECONDS = 240.0   # each command run on the cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    """The environment of every process of these tests, cluster and drivers alike: without
    token authentication on both sides. A driver in token mode (Ray puts RAY_AUTH_MODE=token
    into os.environ of a process that started a local instance, as the test process does in
    test_rllib_*) has the cluster's calls refused, and Ray drops every actor it creates ("all references
    to the actor were removed"): why the first actor died inside the full suite."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


STARTED = "Ray runtime started."
"""What ``ray start`` prints once its node is registered with the GCS (Ray's ``Node`` waits for
the node's entry there first), i.e. once ``ray.nodes()`` lists it alive."""


class _RayStart:
    """One ``ray start --block`` process; a thread reads its output to the end (so the pipe
    never fills while the node runs), keeps the last lines and notes when STARTED shows."""

    def __init__(self, bg, environ: dict[str, str], *args: str):
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        self.proc = bg.popen([ray_bin, "start", "--block", "--disable-usage-stats", *args], env=environ,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.started = threading.Event()
        self.tail: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.tail = (self.tail + [line.rstrip()])[-20:]
            if STARTED in line:
                self.started.set()

    def wait_started(self, deadline: float) -> None:
        """Returns once the node is registered; fails if ``ray start`` exits or the deadline passes."""
        while not self.started.wait(timeout=0.5):
            tail = "\n".join(self.tail)
            assert self.proc.poll() is None, f"ray start exited ({self.proc.returncode}):\n{tail}"
            assert time.monotonic() < deadline, f"ray start had no node up within {START_SECONDS:.0f} s:\n{tail}"


def _stop(bg, node: _RayStart) -> None:
    """End one ``ray start --block`` and every process it started (by their ids)."""
    proc = node.proc
    try:
        family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    try:
        proc.send_signal(signal.SIGTERM)  # ray start --block then stops its node's daemons
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        _, alive = psutil.wait_procs([p for p in map(_proc, family) if p is not None], timeout=10)
        for p in alive:
            p.kill()
    finally:
        bg.reaped(proc)


def _proc(pid: int):
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@contextlib.contextmanager
def _cluster(bg, environ: dict[str, str]):
    """The two nodes, their processes started by ``bg``; yields the head's address."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # every daemon on loopback: the machine's other addresses may not route to itself
    nodes = [_RayStart(bg, environ, "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                       '--resources={"node_a": 1}', "--include-dashboard=false")]
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:  # the head's GCS answers: the second node can join while the head starts the rest
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert nodes[0].proc.poll() is None, "ray start --head exited:\n" + "\n".join(nodes[0].tail)
                assert time.monotonic() < deadline, f"no Ray head at {address} within {START_SECONDS:.0f} s"
                time.sleep(0.5)
        nodes.append(_RayStart(bg, environ, f"--address={address}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                               '--resources={"node_b": 1}'))
        # Both nodes registered (each `ray start` says so), as the drivers expect: the PPO's two
        # actors spread over both, beside the tune's. (A driver process polling ray.nodes() was
        # ~3 s more of a core importing Ray and connecting, 2026-11-26.)
        for node in nodes:
            node.wait_started(time.monotonic() + START_SECONDS)
        yield address
    finally:
        for node in reversed(nodes):
            _stop(bg, node)


def _tune_command(address: str, budget: list[str]) -> list[str]:
    return [sys.executable, "-m", "auturi.cli", "tune", "CartPole-v1", "--backend", "ray", "--address", address,
            "--num-envs", "4", "--num-steps", "8", "--start", "num_actors=2", "--strategy", "grid", *budget,
            "--no-cache"]


PPO_SCRIPT = textwrap.dedent("""
    import json, sys
    import auturi
    from ray.rllib.algorithms.ppo import PPOConfig
    cfg = (PPOConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=2, num_envs_per_env_runner=2)
           .training(train_batch_size_per_learner=64, minibatch_size=64, num_epochs=1).debugging(seed=5))
    auturi.wrap(cfg, backend="ray", address=sys.argv[1], tune=False)
    import ray
    print("connected:", ray.is_initialized() and ray.get_runtime_context().gcs_address)
    algo = cfg.build_algo()
    try:
        result = algo.train()
        rep = result["env_runners"]["auturi"]
        print(json.dumps({"backend": rep["backend"], "nodes": rep["nodes"], "actors": rep["actors"],
                          "steps": result["env_runners"]["num_env_steps_sampled_lifetime"]}, default=str))
    finally:
        algo.stop()
""")

TOKEN_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "auturi-test-token-0123456789abcdef"}  # a token of its own


def _commands(address: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each test's driver process on the cluster, by test name: (argv, extra environment)."""
    return {
        # Both baselines (the 2-actor start and serial); a 1-second budget leaves the confirm
        # rounds at their least (one round, never skipped): each change of layout restarts
        # the Ray actors (~2 s each), and the 3 rounds of a larger budget measured nothing
        # the test checks (the placement printed).
        "test_cli_tune_on_the_cluster_prints_where_each_actor_ran":
            (_tune_command(address, ["--budget-trials", "2", "--budget-seconds", "1", "--json"]), {}),
        "test_wrapped_rllib_ppo_trains_an_iteration_on_the_cluster": ([sys.executable, "-c", PPO_SCRIPT, address], {}),
        "test_a_driver_in_token_auth_mode_is_told_what_differs":
            (_tune_command(address, ["--budget-trials", "1"]), TOKEN_ENV),
    }


def _start_on_cluster(names: set[str]):
    """The cluster and, on it, the driver processes of the tests ``names``, all started at
    once and all ended (the cluster too) before any test reads its result (the per-test leak
    check then never sees one driver's processes while another's test runs), in the
    background (conftest's BackgroundThread; its ``result()``: ``(address, {name:
    CompletedProcess})``). One after another they took ~40 s of the module's ~65 s on 2 cores
    (2026-11-26), mostly each process importing Ray and torch and its Ray actors starting,
    which overlap. They fit the cluster together: the tune's actors take at most 2 of its 4
    CPUs at a time (a 2-actor or a 1-actor layout), the PPO's 2 (one actor per node, as its
    test checks), and the token-mode driver's actors are refused before they hold any. Every
    environment is this process's as the session starts (the tests that run meanwhile may
    change it: a local Ray instance puts RAY_AUTH_MODE into it, see ``_env``)."""
    from tests.conftest import BackgroundThread

    base = _env()

    def run_all(bg):
        with _cluster(bg, base) as address:
            commands = {name: c for name, c in _commands(address).items() if name in names}
            procs = {}
            try:
                for name, (args, extra) in commands.items():
                    procs[name] = bg.popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env={**base, **extra})
                done = {}
                for name, p in procs.items():
                    out, err = p.communicate(timeout=RUN_SECONDS)
                    done[name] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
                return address, done
            finally:
                for p in procs.values():  # on a timeout or an error: none left running
                    if p.poll() is None:
                        p.kill()
                        p.communicate()
                    p.wait()
                    bg.reaped(p)

    return BackgroundThread(run_all, "test_ray_cluster_cli drivers")


def _selected(items) -> set[str]:
    return {item.originalname for item in items
            if getattr(item, "module", None) is not None and item.module.__name__ == __name__}


def early_run(items, tmp_path_factory):
    """Called by conftest's ``_start_early_runs`` as the session starts: the cluster and the
    selected tests' drivers run in the background (after the background runs of the modules
    before this one), beside the modules before this one, which mostly keep one core busy,
    instead of making this module wait ~32 s for them on 2 cores (2026-11-27)."""
    names = _selected(items)
    return _start_on_cluster(names) if names else None


@pytest.fixture(scope="module")
def cluster_runs(request) -> tuple[str, dict[str, subprocess.CompletedProcess]]:
    """``(the head's address, {test name: its driver's CompletedProcess})`` (started with the
    session: ``early_run``); the cluster has been torn down."""
    from tests.conftest import EARLY_RUNS

    runs = EARLY_RUNS.get(__name__) or _start_on_cluster(_selected(request.session.items))
    return runs.result()


@pytest.fixture(scope="module")
def cluster(cluster_runs) -> str:
    """The address the cluster had."""
    return cluster_runs[0]


@pytest.fixture(scope="module")
def on_cluster(cluster_runs) -> dict[str, subprocess.CompletedProcess]:
    return cluster_runs[1]


def test_cli_tune_on_the_cluster_prints_where_each_actor_ran(on_cluster):
    """Both baselines (the 2-actor start and serial) are measured on the cluster, and the
    record says where each of the choice's actors ran."""
    out = on_cluster["test_cli_tune_on_the_cluster_prints_where_each_actor_ran"]
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout)
    actors = rec.get("actors")
    assert actors, f"no placement in the record: {sorted(rec)}"
    assert [a["actor"] for a in actors] == list(range(len(actors)))
    assert actors[0]["envs"][0] == 0 and actors[-1]["envs"][-1] == 3  # the choice's actors hold all 4 envs
    assert all(a["node"] and a["pid"] > 0 for a in actors)
    start = next(t for t in rec["trials"] if t["source"] == "start")
    assert start["config"]["num_actors"] == 2 and start["status"] == "ok", start  # 2 actors ran on the cluster


def test_wrapped_rllib_ppo_trains_an_iteration_on_the_cluster(cluster, on_cluster):
    """auturi.wrap(config, backend="ray", address=...) in a process of its own connects to the
    cluster at once (RLlib's build_algo() would first auto-start Ray with no address: a new
    local instance, or whichever cluster this machine ran last); build_algo() places the two
    actors over both nodes and one PPO train() samples its batch."""
    out = on_cluster["test_wrapped_rllib_ppo_trains_an_iteration_on_the_cluster"]
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    port = cluster.rsplit(":", 1)[1]
    assert lines[0].startswith("connected:") and lines[0].endswith(f":{port}"), lines[0]
    rec = json.loads(lines[-1])
    assert rec["backend"] == "ray" and rec["nodes"] == 2, rec
    assert len(rec["actors"]) == 2 and all(a.rsplit("/", 1)[1].isdigit() for a in rec["actors"]), rec
    assert rec["steps"] >= 64


def test_a_driver_in_token_auth_mode_is_told_what_differs(on_cluster):
    """The cluster runs without token authentication; a driver with RAY_AUTH_MODE=token has its
    actors dropped by Ray before they run: the error names the cause and the fix (it said only
    "died (ActorDiedError)" on node "?")."""
    out = on_cluster["test_a_driver_in_token_auth_mode_is_told_what_differs"]
    assert out.returncode != 0
    assert "RAY_AUTH_MODE here: token" in out.stderr and "the same RAY_AUTH_MODE" in out.stderr, out.stderr[-2000:]

