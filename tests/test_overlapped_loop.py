"""The overlapped actor loop (``ActorPlan.overlap``: a policy on a device, env workers, more
than one forward pass per row): batches spread over the env shares (``spread_batch``), env
workers that queue the steps of several batches (``shm.channel.TaskQueues``), first come
first served.

Two halves. The scheduler alone, in one process: the loop runs over fake remote lanes whose
work completes in an order a seeded generator picks (a slow lane falls behind, envs end up
at different rows), with the real env and policy runners of a serial executor doing the
work, so the data must be the serial rollout's bit for bit, whatever the order. Then the
``shm`` protocol: real worker processes in overlapped layouts (an emulated CUDA device, so
the plan overlaps), a reconfigure that switches kept workers between the overlapped and the
lockstep loop, and a worker that fails mid-queue."""
from __future__ import annotations

import functools
import math
import os
import signal
import threading

import numpy as np
import pytest

from auturi import Config, WorkerError, make_executor
from auturi.envs import CountingEnv, FaultyEnv
from auturi.executor import actor_loop
from auturi.executor.actor_loop import ActorLoop, pick_batch, spread_batch
from auturi.executor.layout import plan_layout
from auturi.executor.local_lanes import LocalEnvLane, LocalPolicyLane
from auturi.testing.emulated_gpu import emulated_gpu
from auturi.testing.emulated_sim import EmulatedSimEnv
from tests.helpers import BlockingEnv, ObsHashPolicy, assert_same


# ---------------------------------------------------------------------------- spread_batch
@pytest.mark.parametrize("seed", range(20))
def test_spread_batch_keeps_order_and_takes_a_quota_per_share_first(seed):
    rng = np.random.default_rng(seed)
    per_share, shares = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    n = per_share * shares
    ready = rng.permutation(n)[:int(rng.integers(1, n + 1))]
    size, quota = int(rng.integers(1, n + 1)), int(rng.integers(1, per_share + 1))
    batch, rest = spread_batch(ready, size, per_share, quota)
    assert len(batch) == min(size, len(ready))
    assert sorted(np.r_[batch, rest].tolist()) == sorted(ready.tolist())  # nothing lost or doubled
    pos = {e: k for k, e in enumerate(ready.tolist())}
    assert [pos[e] for e in batch.tolist()] == sorted(pos[e] for e in batch.tolist())  # first come first
    assert [pos[e] for e in rest.tolist()] == sorted(pos[e] for e in rest.tolist())
    # while some env within its share's quota is left out, no share is over its quota
    within = lambda e: sum(1 for x in ready[:pos[e]].tolist() if x // per_share == e // per_share) < quota  # noqa: E731
    if any(within(e) for e in rest.tolist()):
        counts = np.bincount(batch // per_share, minlength=shares)
        assert counts.max() <= quota


@pytest.mark.parametrize("seed", range(20))
def test_pick_batch_serves_the_envs_furthest_behind_first(seed):
    """The collect ends with its last env: a batch takes the envs on the lowest rows first
    (first come among equals); with a quota below the share size, the spread still holds."""
    rng = np.random.default_rng(seed)
    per_share, shares = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    n = per_share * shares
    ready = rng.permutation(n)[:int(rng.integers(1, n + 1))]
    rows = rng.integers(0, 4, size=len(ready))
    size = int(rng.integers(1, n + 1))
    batch, rest = pick_batch(ready, rows, size, per_share, quota=per_share)  # no spread
    assert len(batch) == min(size, len(ready))
    assert sorted(np.r_[batch, rest].tolist()) == sorted(ready.tolist())
    row = dict(zip(ready.tolist(), rows.tolist()))
    pos = {e: k for k, e in enumerate(ready.tolist())}
    if len(rest):  # every env taken is behind every env left, or level with it and came first
        assert max((row[e], pos[e]) for e in batch.tolist()) < min((row[e], pos[e]) for e in rest.tolist())
    quota = int(rng.integers(1, per_share + 1))
    spread, spread_rest = pick_batch(ready, rows, size, per_share, quota)
    order = sorted(ready.tolist(), key=lambda e: (row[e], pos[e])) if len(ready) > size else ready.tolist()
    want, want_rest = spread_batch(np.array(order, dtype=np.int64), size, per_share, quota)
    assert spread.tolist() == want.tolist() and spread_rest.tolist() == want_rest.tolist()


# ---------------------------------------------------------------------------- the scheduler alone
class _FakeLane:
    """A remote lane whose work the fake queues do when they choose."""

    remote = True

    def __init__(self, runner, name):
        self.runner, self.name = runner, name


class _FakeQueues:
    """``TaskQueues``' interface over in-process runners: each lane's posts wait in order, and
    :meth:`wait` completes the first post of one lane a seeded generator picks (lane 0, the
    "slow" one, rarely), so envs fall out of step."""

    def __init__(self, env_lanes, policy_lanes, seed, slow=0.1):
        self.env_lanes, self.policy_lanes, self.slow = env_lanes, policy_lanes, slow
        self.num_env = len(env_lanes)
        self.rng = np.random.default_rng(seed)
        self.queued = [[] for _ in env_lanes + policy_lanes]
        self.count = np.zeros(len(self.queued), np.int64)
        self.base = self.count.copy()
        self.owed = self.count.copy()
        self.max_spread = 0  # the most rows apart two envs posted in one collect were
        self.local = 0  # reports of the own share's thread
        self._rows: dict[int, int] = {}

    def begin(self):
        self.base = self.count.copy()
        self._rows = {}

    def seq(self):
        return self.count.copy()

    def post(self, lanes, ts, ids):
        need = np.empty(len(ids), np.int64)
        for k in np.unique(lanes).tolist():
            sel = lanes == k
            self.queued[k].append(("step", ts[sel].copy(), ids[sel].copy()))
            self.owed[k] += 1
            need[sel] = self.owed[k]
        for t, i in zip(ts.tolist(), ids.tolist()):
            self._rows[i] = t
        self.max_spread = max(self.max_spread, max(self._rows.values()) - min(self._rows.values()))
        return need

    def submit(self, k, ts, ids):
        j = self.num_env + k
        assert not self.queued[j], "a policy lane was handed a task while busy"
        self.queued[j].append(("act", ts.copy(), ids.copy()))
        self.owed[j] += 1
        return int(self.owed[j])

    def wait(self):
        busy = [k for k, q in enumerate(self.queued) if q]
        assert busy, "the loop waited with nothing in flight"
        weights = np.array([self.slow if k == 0 else 1.0 for k in busy])
        k = busy[int(self.rng.choice(len(busy), p=weights / weights.sum()))]
        kind, ts, ids = self.queued[k].pop(0)
        lane = (self.env_lanes + self.policy_lanes)[k]
        (lane.runner.step if kind == "step" else lane.runner.act)(ts, ids)
        self.count[k] += 1

    def local_report(self):  # the own share's thread: TaskQueues posts the semaphore; nothing to do here
        self.local += 1

    def settle(self):
        assert not any(self.queued), "the collect ended with work queued"
        assert (self.count == self.owed).all()


def _run_overlapped(cfg: Config, env_fn, steps, seed: int, slow: float = 0.1):
    """``steps`` collects of a serial executor whose loop is the overlapped one over fake
    remote lanes (share 0 and, with one replica, the policy stay in-process, as in ``shm``)."""
    policy = ObsHashPolicy(env_fn().action_space)
    fakes = []
    with make_executor(env_fn, policy, num_envs=cfg.num_envs, config=Config.serial(cfg.num_envs),
                       backend="serial", seed=3) as ex:
        loops = []
        for ap in plan_layout(cfg, cores=[0, 1]).actors:
            env_lanes = [LocalEnvLane(ex._envs)] + [_FakeLane(ex._envs, f"env {d}")
                                                   for d in range(1, cfg.env_parallel_degree)]
            pol_lanes = ([LocalPolicyLane(ex._policy)] if cfg.policies_per_actor == 1 else
                         [_FakeLane(ex._policy, f"policy {r}") for r in range(cfg.policies_per_actor)])

            def queues(envs, pols, a=ap.index):
                fakes.append(_FakeQueues(envs, pols, seed * 100 + a, slow))
                return fakes[-1]

            loops.append(ActorLoop(ap.env_ids, env_lanes, pol_lanes, ap.batch_size, lambda: [], None,
                                   lockstep=ap.lockstep, overlap=ap.overlap, task_queues=queues))
        ex._loops = loops
        rollouts = [ex.collect(s) for s in steps]
    return rollouts, fakes


OVERLAPPED = [
    Config(1, 8, 4, 2, "cuda", 4),  # two replicas, two batches
    Config(1, 8, 2, 2, "cuda", 2),  # four envs a worker over four batches
    Config(1, 8, 4, 1, "cuda", 2),  # the actor's own replica
    Config(1, 6, 3, 3, "cuda", 1),  # batch 1
    Config(1, 8, 2, 1, "cuda", 3),  # batches that do not divide the envs (3, 3, 2)
    Config(1, 8, 8, 2, "cuda", 4),  # one env a worker
    Config(2, 4, 2, 2, "cuda", 2),  # two actors
]


def _cfg_id(c: Config) -> str:
    return f"A{c.num_actors}E{c.envs_per_actor}D{c.env_parallel_degree}P{c.policies_per_actor}B{c.policy_batch_size}"


@pytest.mark.parametrize("cfg", OVERLAPPED, ids=_cfg_id)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_completion_order_gives_the_serial_rollout(cfg, seed):
    with emulated_gpu():
        assert all(ap.overlap for ap in plan_layout(cfg, cores=[0, 1]).actors)
    env_fn = functools.partial(CountingEnv, max_len=9)
    steps = (7, 9, 5)
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=cfg.num_envs,
                       config=Config.serial(cfg.num_envs), backend="serial", seed=3) as ex:
        want = [ex.collect(s) for s in steps]
    got, fakes = _run_overlapped(cfg, env_fn, steps, seed)
    assert_same(got, want)
    assert sum(len(r.final_observations) for r in want) >= 4  # episodes ended mid-collect and went on
    assert all(f.count.sum() > 0 for f in fakes)  # the fake lanes did the remote work
    assert max(f.max_spread for f in fakes) >= 1  # not lockstep: envs were handed on different rows


def test_a_slow_lane_holds_no_batch_back():
    """First come first served: while the slow lane's envs lag, the others go on rows ahead
    (a batch is topped up from any share), and the data is still the serial rollout."""
    cfg = Config(1, 12, 4, 2, "cuda", 3)
    env_fn = functools.partial(CountingEnv, max_len=9)
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=12, config=Config.serial(12),
                       backend="serial", seed=3) as ex:
        want = [ex.collect(12)]
    got, fakes = _run_overlapped(cfg, env_fn, (12,), seed=0, slow=0.02)
    assert_same(got, want)
    assert fakes[0].max_spread >= 4


def test_a_short_batch_goes_once_the_stepping_envs_could_not_fill_it(monkeypatch):
    """At a collect's end (and behind a slow lane) fewer envs are left than a batch holds: the
    ready ones go to a free replica while others still step, rather than waiting for every env
    to come back (a step's delay for each of them, the replica idle meanwhile)."""
    # The own share steps in the loop's thread: a thread of its own (taken when its steps'
    # mean passes OWN_THREAD_SECONDS, as a pause of this process could make them) would
    # reorder completions past the seeded ones this test reads (it failed 1-2 runs in 10).
    monkeypatch.setattr(actor_loop, "OWN_THREAD_SECONDS", math.inf)
    cfg = Config(1, 12, 4, 2, "cuda", 4)
    env_fn = functools.partial(CountingEnv, max_len=9)
    short_while_stepping = []
    orig = _FakeQueues.submit

    def submit(self, k, ts, ids):
        stepping = sum(len(i) for q in self.queued[:self.num_env] for _, _, i in q)
        if len(ids) < cfg.policy_batch_size:
            short_while_stepping.append(stepping > 0)
            assert len(ids) + stepping < cfg.policy_batch_size or stepping == 0  # never held a fillable batch short
        return orig(self, k, ts, ids)

    _FakeQueues.submit = submit
    try:
        with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=12, config=Config.serial(12),
                           backend="serial", seed=3) as ex:
            want = [ex.collect(10)]
        got, _ = _run_overlapped(cfg, env_fn, (10,), seed=1, slow=0.3)
    finally:
        _FakeQueues.submit = orig
    assert_same(got, want)
    assert any(short_while_stepping)


def test_the_actors_own_share_is_stepped_by_it_between_batches():
    """Share 0 is the actor's: its envs never go to a remote lane, and they keep up (the
    collect ends with every env at the last row, asserted by the data above); here: no fake
    lane ever got an env of share 0."""
    cfg = Config(1, 8, 4, 2, "cuda", 4)
    env_fn = functools.partial(CountingEnv, max_len=9)
    posted: list[int] = []
    orig = _FakeQueues.post

    def post(self, lanes, ts, ids):
        posted.extend(ids.tolist())
        return orig(self, lanes, ts, ids)

    _FakeQueues.post = post
    try:
        _run_overlapped(cfg, env_fn, (6,), 0)
    finally:
        _FakeQueues.post = orig
    assert posted and not {0, 1} & set(posted) and set(posted) == set(range(2, 8))


# ---------------------------------------------------------------------------- the shm protocol
def _straggler(**kw):
    """Deterministic data, step waits drawn per env and step (a heavy tail): envs of
    different workers finish in varying order."""
    return functools.partial(EmulatedSimEnv, "straggler", time_scale=0.01, **kw)


def _collects(backend, cfg, env_fn, steps=(9, 12, 7), policy=None, reconfigure_to=None):
    policy = policy or ObsHashPolicy(env_fn().action_space)
    with emulated_gpu():
        with make_executor(env_fn, policy, num_envs=cfg.num_envs, config=cfg, backend=backend, seed=5) as ex:
            out = []
            for k, s in enumerate(steps):
                if reconfigure_to is not None and k == 1:
                    ex.reconfigure(reconfigure_to)
                out.append(ex.collect(s))
            return out


@pytest.mark.parametrize("cfg", [
    Config(1, 8, 4, 2, "cuda", 4),
    Config(1, 8, 2, 1, "cuda", 2),
    # batches of 3 over shares of 4: posts of one and two envs, so the ring in each worker's
    # slot (8 entries) wraps in the middle of a post (13 times in these collects)
    Config(1, 8, 2, 2, "cuda", 3),
    Config(2, 4, 2, 2, "cuda", 2),  # actors in processes of their own
], ids=_cfg_id)
def test_shm_overlapped_layouts_give_the_serial_rollout(cfg):
    env_fn = _straggler()
    want = _collects("serial", Config.serial(cfg.num_envs), env_fn)
    assert_same(_collects("shm", cfg, env_fn), want)


def test_kept_workers_switch_between_the_overlapped_and_the_lockstep_loop():
    """A batch change keeps every process (REPLAN or a new host over the same workers): the
    workers go from queued posts to rows and back, and the data stays the serial rollout."""
    env_fn = functools.partial(CountingEnv, max_len=9)
    steps = (6, 8, 5, 7)
    want = _collects("serial", Config.serial(8), env_fn, steps=steps)

    def go(first, second):
        policy = ObsHashPolicy(env_fn().action_space)
        with emulated_gpu():
            with make_executor(env_fn, policy, num_envs=8, config=first, backend="shm", seed=5) as ex:
                out = [ex.collect(steps[0])]
                ex.reconfigure(second)
                assert ex.last_reconfigure["started"] == 0  # the same processes, another loop
                out.append(ex.collect(steps[1]))
                ex.reconfigure(first)
                out += [ex.collect(s) for s in steps[2:]]
                return out

    lockstep, overlapped = Config(1, 8, 4, 1, "cuda", 8), Config(1, 8, 4, 1, "cuda", 4)
    assert_same(go(overlapped, lockstep), want)
    two_actors_lockstep, two_actors_overlapped = Config(2, 4, 2, 1, "cuda", 4), Config(2, 4, 2, 1, "cuda", 2)
    assert_same(go(two_actors_overlapped, two_actors_lockstep), want)


def test_a_worker_failing_mid_queue_is_a_worker_error_naming_the_env():
    """Env 5 (env worker 2's second env, so its failure comes mid-queue) fails at its 4th step."""
    fns = [CountingEnv] * 8
    fns[5] = functools.partial(FaultyEnv, fail_step=4)
    cfg = Config(1, 8, 4, 2, "cuda", 4)
    with emulated_gpu():
        ex = make_executor(fns, ObsHashPolicy(CountingEnv().action_space), config=cfg, backend="shm")
        with ex, pytest.raises(WorkerError, match="env worker 2") as err:
            ex.collect(10)
    assert "fails on purpose" in str(err.value) and "env 5" in str(err.value)


# ---------------------------------------------------------------------------- the own share's thread
@pytest.mark.parametrize("seed", [0, 1])
def test_the_own_share_stepped_on_its_thread_gives_the_serial_rollout(monkeypatch, seed):
    """Long own-share steps go to a thread (forced here from the first task): whatever the
    order the thread and the lanes finish in, the data is the serial rollout's, and each of
    the thread's tasks was reported."""
    monkeypatch.setattr(actor_loop, "OWN_THREAD_SECONDS", 0.0)
    cfg = Config(1, 12, 4, 2, "cuda", 3)
    env_fn = functools.partial(CountingEnv, max_len=9)
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=12, config=Config.serial(12),
                       backend="serial", seed=3) as ex:
        want = [ex.collect(s) for s in (7, 9)]
    got, fakes = _run_overlapped(cfg, env_fn, (7, 9), seed=seed, slow=0.3)
    assert_same(got, want)
    assert fakes[0].local > 0 and not any(t.name == "auturi own env share" for t in threading.enumerate())


@pytest.mark.parametrize("cfg", [Config(1, 8, 4, 2, "cuda", 4), Config(1, 8, 2, 1, "cuda", 2)], ids=_cfg_id)
def test_shm_own_share_on_its_thread_gives_the_serial_rollout(monkeypatch, cfg):
    """The same through real workers (one actor: its loop runs in this process, where the
    threshold is patched); the semaphore's counts stay even across collects."""
    monkeypatch.setattr(actor_loop, "OWN_THREAD_SECONDS", 0.0)
    env_fn = _straggler()
    want = _collects("serial", Config.serial(cfg.num_envs), env_fn)
    assert_same(_collects("shm", cfg, env_fn), want)


def test_a_failure_in_the_own_share_on_its_thread_is_raised_by_the_collect(monkeypatch):
    """Env 0 (the actor's own share) fails at its 4th step, on the thread: the collect raises
    the error the env raised in the loop, naming it, and the thread ends."""
    fns = [CountingEnv] * 8
    fns[0] = functools.partial(FaultyEnv, fail_step=4)
    cfg = Config(1, 8, 4, 2, "cuda", 4)
    messages = []
    for threshold in (0.0, 1e9):  # on the thread, then in the loop
        monkeypatch.setattr(actor_loop, "OWN_THREAD_SECONDS", threshold)
        with emulated_gpu():
            ex = make_executor(fns, ObsHashPolicy(CountingEnv().action_space), config=cfg, backend="shm")
            with ex, pytest.raises(Exception) as err:
                ex.collect(10)
        messages.append((type(err.value), str(err.value)))
    assert messages[0] == messages[1] and "fails on purpose" in messages[0][1]
    assert not any(t.name == "auturi own env share" for t in threading.enumerate())


# ---------------------------------------------------------------------------- the bench's choice
def test_the_emulated_gpu_bench_offers_overlapped_layouts_and_names_each_loop():
    """``python -m bench.emulated_gpu --overlap`` adds overlapped layouts beside their lockstep
    rivals, and its table says which loop each layout runs (the plan's choice)."""
    from bench.emulated_gpu import layouts, loop_of

    plain, more = layouts(32, 16, quick=False), layouts(32, 16, quick=False, overlap=True)
    assert set(plain) < set(more)
    loops = {name: loop_of(cfg) for name, cfg in more.items()}
    assert loops["auturi_1x32_d16"] == "lockstep" and loops["auturi_2x16_d16"] == "lockstep"
    assert loops["auturi_1x32_d16_2rep"] == "overlapped" and loops["auturi_1x32_d32_4rep_b8"] == "overlapped"
    assert loops["auturi_1x32_d16_cpu"] == "lockstep"
    assert sum(v == "overlapped" for v in loops.values()) >= 5
    assert loop_of(Config(1, 8, 2, 2, "cpu", 4)) == "general"


# ---------------------------------------------------------------------------- kept replicas' counts
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_batch_change_under_kept_actor_processes_keeps_the_serial_rollout(device):
    """A batch change keeps actor processes and their replicas; the caller tells each kept
    replica its torch threads (a command the actor does not see), so the actor re-reads what
    each lane has reported when it takes its new plan. Before, its count for each replica was
    one short, the general loop took a replica's task as done the moment it handed it out, and
    2 of 3 runs collected other data than serial (the general loop on the CPU; with a device
    the overlapped one, which reads the counts afresh each collect)."""
    env_fn = functools.partial(CountingEnv, max_len=9)
    steps = (6, 20, 20)
    want = _collects("serial", Config.serial(8), env_fn, steps=steps)
    first, second = Config(2, 4, 2, 2, device, 2), Config(2, 4, 2, 2, device, 1)
    policy = ObsHashPolicy(env_fn().action_space)
    with emulated_gpu():
        with make_executor(env_fn, policy, num_envs=8, config=first, backend="shm", seed=5) as ex:
            got = [ex.collect(steps[0])]
            ex.reconfigure(second)
            assert ex.last_reconfigure["started"] == 0 and ex.last_reconfigure["kept"] == 8
            got += [ex.collect(s) for s in steps[1:]]
    assert_same(got, want)


# ---------------------------------------------------------------------------- stuck and dead lanes
def test_an_env_stuck_mid_queue_is_a_worker_error_naming_its_worker(tmp_path):
    """Env 3 (env worker 1's second env) blocks in its step forever while the overlapped loop
    waits on its queue: within ``worker_timeout`` a WorkerError names that worker, not the
    actor, and carries the blocked frame."""
    os.mkfifo(tmp_path / "fifo")
    plain, blocking = CountingEnv, functools.partial(BlockingEnv, str(tmp_path), 3, os.getpid())
    cfg = Config(1, 4, 2, 2, "cuda", 2)
    with emulated_gpu():
        ex = make_executor([plain, plain, plain, blocking], ObsHashPolicy(CountingEnv().action_space), config=cfg,
                           backend="shm", worker_timeout=2.0)
        with ex, pytest.raises(WorkerError) as e:
            ex.collect(10)
    assert e.value.worker == "env worker 1 of actor 0 (envs 2-3)"
    assert "made no progress" in e.value.reason and "in step" in e.value.stack


class _ReplicaDies(ObsHashPolicy):
    """The replica process that reaches its ``at``-th batch first SIGKILLs itself."""

    def __init__(self, space, flag: str, at: int, main_pid: int):
        super().__init__(space)
        self.flag, self.at, self.main_pid, self.calls = flag, at, main_pid, 0

    def act(self, obs, noise):
        self.calls += 1
        if self.calls == self.at and os.getpid() != self.main_pid:
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().act(obs, noise)


def test_a_killed_replica_surfaces_in_the_overlapped_loop(tmp_path):
    """One replica dies mid-collect while the other and the env workers keep reporting: the
    loop's waits keep succeeding, and the death still surfaces (the waiter's periodic check),
    long before the collect could end."""
    policy = _ReplicaDies(CountingEnv().action_space, str(tmp_path / "died"), 20, os.getpid())
    with emulated_gpu():
        ex = make_executor(CountingEnv, policy, num_envs=8, config=Config(1, 8, 4, 2, "cuda", 4), backend="shm")
        with ex, pytest.raises(WorkerError, match=r"policy replica \d.*SIGKILL"):
            ex.collect(20_000)
