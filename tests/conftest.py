"""Every test must leave no worker process and no shared-memory segment behind."""
from __future__ import annotations

import logging
import multiprocessing.resource_tracker as resource_tracker
import os
import subprocess
import threading
import time

import psutil
import pytest

_created_semaphores: set[str] = set()  # names of every named semaphore this process created
_register = resource_tracker.register


def _record_register(name: str, rtype: str) -> None:
    """multiprocessing registers each named semaphore it creates with its resource tracker
    (``synchronize.SemLock`` looks ``register`` up at each creation): note the name, whoever
    chose it, so a leak is seen even under multiprocessing's own ``mp-*`` names."""
    if rtype == "semaphore":
        _created_semaphores.add(name.lstrip("/"))
    _register(name, rtype)


resource_tracker.register = _record_register


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_in_one_folder(tmp_path_factory):
    """SB3's logger makes a ``tempdir/SB3-<date>`` folder per ``learn()`` unless told where
    (``SB3_LOGDIR``, read by the test processes and the scripts they start): one folder of the
    test session's, removed with its temporary files, instead of thousands left in /tmp."""
    old = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    yield
    if old is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = old


EARLY_RUNS: dict[str, object] = {}
"""What each module's ``early_run`` started as the session started (``_start_early_runs``), by
module name."""


@pytest.fixture(autouse=True, scope="session")
def _start_early_runs(request, tmp_path_factory, _sb3_logs_in_one_folder):
    """Starts, as the session starts, the long runs of one core that a test module declares
    with a module-level ``early_run(items, tmp_path_factory)`` (which returns a handle with an
    ``end()``, or None when none of its tests in ``items`` needs it): such a run goes on beside
    the modules before its own, on the core their in-process tests leave idle, instead of
    making its module wait for it (test_bench's smoke run: ~20 s of one core, 2026-11-27). The
    module reads it from EARLY_RUNS; each still running at the session's end is ended."""
    modules = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "early_run"):
            modules.setdefault(module.__name__, module)
    try:
        for name, module in modules.items():
            handle = module.early_run(request.session.items, tmp_path_factory)
            if handle is not None:
                EARLY_RUNS[name] = handle
        yield
    finally:
        for handle in EARLY_RUNS.values():
            handle.end()
        EARLY_RUNS.clear()


def our_segments(pid: int | None = None) -> set[str]:
    """Segments and named semaphores created by process ``pid`` (default: this one; their names
    carry it: ``auturi_<pid>_*``, ``sem.auturi_<pid>_*``) and, for this process, every named
    semaphore it registered; other sessions' runs on the same machine make their own and must
    not count."""
    pid = pid or os.getpid()
    prefixes = (f"auturi_{pid}_", f"sem.auturi_{pid}_")
    names = set(os.listdir("/dev/shm"))
    found = {n for n in names if n.startswith(prefixes)}
    if pid == os.getpid():
        found |= {f"sem.{n}" for n in _created_semaphores if f"sem.{n}" in names}
    return found


BACKGROUND_PIDS: set[int] = set()
"""Processes a module starts to run beside its other tests (test_bench's smoke run), by pid,
while they run: the per-test check skips them and every process they started, since they are
no test's leftovers; the module's own fixture waits for them (or ends them) and then drops
their pid from here."""


def _in_background(p: psutil.Process) -> bool:
    return p.pid in BACKGROUND_PIDS or any(a.pid in BACKGROUND_PIDS for a in p.parents())


class BackgroundRun:
    """A process started ahead of the test that reads it (test_bench's smoke run, started with
    the session: ``_start_early_runs``), run beside other tests meanwhile: one core's work that
    would otherwise wait for them, or they for it. Its output goes to files in ``folder``
    (nobody reads a pipe meanwhile); its pid is in BACKGROUND_PIDS until it ended; ``end()``
    ends it if no test waited for it."""

    def __init__(self, args: list[str], folder, timeout: float, **popen_kw):
        self.args, self.folder, self.deadline = list(args), folder, time.monotonic() + timeout
        self._result: subprocess.CompletedProcess | None = None
        with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=err, **popen_kw)
        BACKGROUND_PIDS.add(self.proc.pid)

    def result(self) -> subprocess.CompletedProcess:
        """The run's result (text output), once it ended; past its ``timeout`` (counted from
        its start) it is killed and ``TimeoutExpired`` raised."""
        if self._result is None:
            try:
                self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            finally:
                self.end()
            self._result = subprocess.CompletedProcess(self.args, self.proc.returncode,
                                                       (self.folder / "stdout.txt").read_text(),
                                                       (self.folder / "stderr.txt").read_text())
        return self._result

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        BACKGROUND_PIDS.discard(self.proc.pid)


class BackgroundThread:
    """An early run of several processes, in order or a few at a time (test_cli's side runs,
    test_readme's examples): ``target(self)`` runs in a thread of this process and starts each
    process with ``self.run`` (or ``self.popen``), whose pid stays in BACKGROUND_PIDS until it
    ended; ``result()`` waits for the thread and returns what ``target`` returned (or raises
    what it raised); ``end()`` kills what still runs and starts nothing more. Such a run fills
    the core that in-process tests leave idle while the modules before its own run (the
    suite's user time was about its wall time in a 2-core run, 2026-11-27). Such runs go one
    after another, in the order they were made (the order of their modules): each would
    otherwise crowd the cores as the session starts, when the first module's run is the one
    needed first."""

    _lane: list[BackgroundThread] = []  # every one made in this session, in order

    def __init__(self, target, name: str):
        self._before = list(BackgroundThread._lane)
        BackgroundThread._lane.append(self)
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self._ended = False
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._main, args=(target,), name=name, daemon=True)
        self._thread.start()

    def _main(self, target) -> None:
        for other in self._before:
            other._thread.join()
        try:
            self._result = target(self)
        except BaseException as e:  # noqa: BLE001  (raised again in the test that reads the result)
            self._error = e

    def popen(self, args: list[str], **kw) -> subprocess.Popen:
        """``subprocess.Popen(args, **kw)``, its pid in BACKGROUND_PIDS until ``reaped(proc)``."""
        with self._lock:
            if self._ended:
                raise RuntimeError("the session ended before this background process started")
            proc = subprocess.Popen(args, **kw)
            BACKGROUND_PIDS.add(proc.pid)
            self._procs.add(proc)
        return proc

    def reaped(self, proc: subprocess.Popen) -> None:
        """``proc`` has ended and been waited for: no longer in the background."""
        with self._lock:
            BACKGROUND_PIDS.discard(proc.pid)
            self._procs.discard(proc)

    def run(self, args: list[str], timeout: float, input: str | None = None, **kw) -> subprocess.CompletedProcess:
        """What ``subprocess.run(args, capture_output=True, text=True, timeout=..., input=...)``
        returns or raises, its process started with ``popen``."""
        if input is not None:
            kw["stdin"] = subprocess.PIPE
        proc = self.popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
        finally:
            if proc.poll() is None:  # an error in this thread (end() kills it from another)
                proc.kill()
            proc.wait()
            self.reaped(proc)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def end(self) -> None:
        with self._lock:
            self._ended = True
            procs = list(self._procs)
        for proc in procs:  # each with what it started (a killed driver's workers would stay)
            try:
                family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in family:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        self._thread.join(timeout=60)


def live_children() -> list[psutil.Process]:
    """Children of the test process, less multiprocessing's own long-lived helpers and the
    processes of BACKGROUND_PIDS."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:  # a process that ends while we read it is not left running
            cmd = " ".join(p.cmdline())
            name = p.name()
            if p.status() == psutil.STATUS_ZOMBIE or BACKGROUND_PIDS and _in_background(p):
                continue
        except psutil.NoSuchProcess:
            continue
        if "forkserver" in cmd and "auturi" not in name or "resource_tracker" in cmd:
            continue
        if name.startswith("auturi") or "multiprocessing" in cmd:
            out.append(p)
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    before = our_segments()
    yield
    assert our_segments() - before == set(), "shared-memory segments or named semaphores leaked"
    left = live_children()
    assert not left, f"worker processes left running: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left if p.is_running()]}"


FAST_FAILURE_DETECTION = {
    # The GCS health-checks each raylet every period and declares its node dead after
    # `threshold` checks in a row fail. A killed raylet's port refuses at once, so a lost node
    # is seen after ~threshold * period: ~2 s here against ~14 s with Ray's 5 x 3 s (measured
    # 2026-11-26, Ray 2.60; the node-loss test spent those 14 s waiting). A slow but alive
    # raylet is no likelier to be declared dead: each check still waits Ray's own
    # health_check_timeout_ms (10 s) for an answer, and 5 must fail in a row.
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 5,
    # A node joining mid-test (the node-loss test's third) is checked from 1 s after it
    # registers, not 5 s: its raylet serves before it registers.
    "health_check_initial_delay_ms": 1000,
    # ray.kill sends SIGTERM, then SIGKILL this much later to a worker still there: a
    # SIGSTOPped actor never acts on SIGTERM, so it ended 5 s after ray.kill by Ray's default
    # and 1 s with this (measured); a running actor ends within ~20 ms either way.
    "kill_worker_timeout_milliseconds": 1000,
}
"""Ray system config of the test cluster (set on the head node; the other nodes read it from
the GCS). It changes how fast Ray notices a dead node or ends a stopped worker, nothing a test
asserts: each test still waits for Ray's own verdict."""

RAY_NODE_CPUS = 8
"""Logical CPUs of each test node (Ray only counts them; the machine has 2 cores): an actor of
the contract's configs asks for up to 5 (its processes), and test_executor_ray's error for a
config no node holds names 8."""

_ray_test_cluster: dict = {"cluster": None}


def _start_ray_test_cluster():
    """A head node and a second node, each with RAY_NODE_CPUS logical CPUs and a custom resource
    naming it ("node_a", "node_b"), with this process connected."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    small = {"object_store_memory": 80 * 2**20}
    # No autoscaler monitor and no log monitor on the head: two Python daemons (together ~1.4 s
    # of CPU per start-up on this 2-core machine, and a poll each while idle) for what no test
    # uses: nothing autoscales, and the driver takes no worker logs (log_to_driver=False).
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": RAY_NODE_CPUS, "resources": {"node_a": 1}, "include_dashboard": False,
                                      "no_monitor": True, "include_log_monitor": False,
                                      # a copy: Ray adds keys of its session to the dict it is given
                                      "_system_config": dict(FAST_FAILURE_DETECTION), **small})
    cluster.add_node(num_cpus=RAY_NODE_CPUS, resources={"node_b": 1}, **small)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    return cluster


def _shut_ray_test_cluster_down() -> None:
    cluster = _ray_test_cluster["cluster"]
    if cluster is not None:
        import ray

        ray.shutdown()
        cluster.shutdown()
        _ray_test_cluster["cluster"] = None


@pytest.fixture(scope="session")
def _ray_test_cluster_owner():
    """Shuts the test cluster down at the session's end if no module's teardown did (the last
    module using it handed it on to a next one that then did not run)."""
    yield
    _shut_ray_test_cluster_down()


def _a_later_module_uses_the_cluster(request) -> bool:
    """Whether a test run after this module's last one is of another module that asks for
    ray_cluster by name (test_executor_ray and test_faces_ray after test_executor_contract, in a
    full run). A module that asks for it later by getfixturevalue is not seen: the cluster then
    starts again for it, as every module's own cluster did before."""
    items = request.session.items
    last = max((i for i, item in enumerate(items) if getattr(item, "module", None) is request.module), default=-1)
    return any("ray_cluster" in getattr(item, "fixturenames", ())
               and getattr(item, "module", None) is not request.module for item in items[last + 1:])


@pytest.fixture(scope="module")
def ray_cluster(request, _ray_test_cluster_owner):
    """The suite's Ray test cluster, two nodes on this machine (Ray's own cluster utilities),
    with this process connected while the module runs; skipped only when Ray is not installed.

    One cluster serves every module that uses it (test_executor_contract's ray cases,
    test_executor_ray, test_faces_ray): it starts at the first of them and shuts down after the
    last, and the modules between run with this process disconnected from it (``ray.shutdown()``
    ends the connection, not the cluster). A start-up took ~6 s of the 2 cores and each module
    started its own; the cluster idling between them takes ~4% of a core (measured
    2026-11-26). Tests that add a node remove it again."""
    ray = pytest.importorskip("ray")
    cluster = _ray_test_cluster["cluster"]
    if cluster is None:
        cluster = _ray_test_cluster["cluster"] = _start_ray_test_cluster()
    else:
        if ray.is_initialized():  # another module's own Ray instance or connection
            ray.shutdown()
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    yield cluster
    if _a_later_module_uses_the_cluster(request):
        ray.shutdown()
    else:
        _shut_ray_test_cluster_down()
