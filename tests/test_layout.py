"""The layout plan (auturi/executor/layout.py) against the rules the backends apply today.

No process is started: each plan is checked against an independent statement of the
``shm``/``ray`` rules (the backends, ``ActorLoop`` and ``Config.num_processes`` read the plan
now, so the rules are restated here rather than asked of them), and against hand-worked values."""
from __future__ import annotations

import types
from collections import Counter

import pytest

from auturi import Config
from auturi.executor.actor_loop import ActorLoop
from auturi.executor.layout import MAIN, EnvMove, plan_layout, policy_threads, ray_actor_cores
from auturi.resources import ClusterResources
from auturi.resources import cuda_device_count, usable_cores, usable_cores_set
from auturi.tuner import space as space_mod

CONFIGS = [
    Config.serial(4),
    Config(envs_per_actor=8, env_parallel_degree=8),  # degree N
    Config(envs_per_actor=8, env_parallel_degree=2, policy_batch_size=4),
    Config(num_actors=4, envs_per_actor=2),  # multi-actor, serial inside
    Config(num_actors=2, envs_per_actor=6, env_parallel_degree=3, policies_per_actor=2, policy_batch_size=3),
    Config(envs_per_actor=6, policies_per_actor=3, policy_batch_size=2),  # multi-replica, batch < envs
    Config(num_actors=3, envs_per_actor=4, env_parallel_degree=4, policies_per_actor=4, policy_batch_size=1),
    Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policy_device="cuda:1"),
    Config(num_actors=2, envs_per_actor=4, policies_per_actor=2, policy_device="cuda", policy_batch_size=2),
]
CORES = [(0,), (0, 1), (2, 5, 7, 9), tuple(range(16))]


def _ids(cfg: Config, a: int) -> list[int]:
    return list(range(a * cfg.envs_per_actor, (a + 1) * cfg.envs_per_actor))


def _expected_processes(cfg: Config, cores: list[int]) -> list[tuple]:
    """(kind, name, env ids, cpus) of the shm slots, in slot order, as _apply_config makes them."""
    out, k = [], cfg.envs_per_worker
    if cfg.num_actors > 1:
        for a in range(cfg.num_actors):
            ids = _ids(cfg, a)
            out.append(("actor", f"actor {a} (envs {ids[0]}-{ids[-1]})", tuple(ids[:k])))
    for a in range(cfg.num_actors):
        for w in range(1, cfg.env_parallel_degree):
            lo = _ids(cfg, a)[0] + w * k
            out.append(("env", f"env worker {w} of actor {a} (envs {lo}-{lo + k - 1})", tuple(range(lo, lo + k))))
        if cfg.policies_per_actor > 1:
            for r in range(cfg.policies_per_actor):
                ids = _ids(cfg, a)
                out.append(("policy", f"policy replica {r} of actor {a} (envs {ids[0]}-{ids[-1]}) on {cfg.policy_device}",
                            ()))
    return out


def _check_spread(p, cfg: Config, cores: list[int]) -> None:
    """The pins of every env-stepping process (lane): one usable core each; as many lanes on
    every core as on any other, give or take one; an actor's lanes on distinct cores while it
    has no more than the cores; actor processes on distinct cores while there are no more
    than the cores. Replicas are not pinned."""
    n, A, D = len(cores), cfg.num_actors, cfg.env_parallel_degree
    hosts = [p.main] if A == 1 else [q for q in p.processes if q.kind == "actor"]
    lanes = []
    for a, host in enumerate(hosts):
        workers = [q for q in p.processes if q.kind == "env" and q.actor == a]
        mine = [host.cpus[:1]] + [q.cpus for q in workers] if D > 1 or A > 1 else []
        assert all(len(c) == 1 and c[0] in cores for c in mine)
        if D <= n:
            assert len({c[0] for c in mine}) == len(mine)
        lanes += [c[0] for c in mine]
    if lanes:
        per_core = [lanes.count(c) for c in cores]
        assert max(per_core) - min(per_core) <= 1
    if 1 < A <= n:
        assert len({q.cpus[0] for q in hosts}) == A
    _check_policy_cores(hosts if A > 1 else [], cfg, cores, set(lanes))
    assert all(q.cpus == () for q in p.processes if q.kind == "policy")


def _check_policy_cores(hosts, cfg: Config, cores: list[int], lanes: set[int]) -> None:
    """An actor process running its own CPU policy is pinned to its lane's core and an equal
    run of the cores no lane holds, none shared with another actor, as many cores as the
    torch threads planned where there are enough free cores; any other actor process to its
    lane's core alone."""
    extras = [h.cpus[1:] for h in hosts]
    if cfg.policy_device != "cpu" or cfg.policies_per_actor > 1:
        assert all(e == () for e in extras)
        return
    free = [c for c in cores if c not in lanes]
    flat = [c for e in extras for c in e]
    assert len(set(flat)) == len(flat) and set(flat) <= set(free)
    assert {len(e) for e in extras} <= {len(free) // cfg.num_actors}
    if hosts and cfg.num_actors <= len(cores):  # one lane core each: threads fill the cores pinned
        assert all(len(h.cpus) == h.threads or len(free) == 0 for h in hosts), [(h.cpus, h.threads) for h in hosts]


def _shm_threads(cfg: Config, n: int) -> int:
    """Torch threads of a replica process on n usable cores: 1 on a GPU, else the cores env
    workers leave free shared by every replica of every actor, at least 1."""
    if cfg.policy_device != "cpu":
        return 1
    return max(1, (n - cfg.num_actors * (cfg.env_parallel_degree - 1)) // (cfg.num_actors * cfg.policies_per_actor))


@pytest.mark.parametrize("cores", CORES, ids=lambda c: f"{len(c)}cores")
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_shm_plan_follows_the_current_rules(cfg, cores):
    p = plan_layout(cfg, cores=cores)
    assert p.backend == "shm" and p.cores == tuple(sorted(cores))
    assert [(q.kind, q.name, q.env_ids) for q in p.processes] == _expected_processes(cfg, list(cores))
    _check_spread(p, cfg, list(cores))
    assert p.num_processes == len(p.processes) == cfg.num_processes
    # The tuner's model counts A * (D + (P if P > 1 else 0)) busy processes.
    assert p.busy_processes == cfg.num_actors * (cfg.env_parallel_degree + (cfg.policies_per_actor > 1)
                                                 * cfg.policies_per_actor)
    threads = _shm_threads(cfg, len(cores))
    assert policy_threads(cfg, len(cores)) == threads
    k = cfg.envs_per_worker
    for a, ap in enumerate(p.actors):
        ids = _ids(cfg, a)
        assert ap.index == a and list(ap.env_ids) == list(cfg.actor_env_ids(a))
        # ActorHost steps ids[:envs_per_worker] itself; env worker w the w-th share after it.
        assert [s.env_ids for s in ap.env_shares] == [tuple(ids[d * k:(d + 1) * k])
                                                       for d in range(cfg.env_parallel_degree)]
        assert ap.env_shares[0].process == ap.host == (MAIN if cfg.num_actors == 1 else p.processes[a].name)
        assert ap.batch_size == cfg.policy_batch_size and ap.envs_per_share == k
        assert len(ap.replicas) == cfg.policies_per_actor
        assert ap.local_policy == (cfg.policies_per_actor == 1)
        for r in ap.replicas:
            assert r.device == cfg.policy_device
            if cfg.policies_per_actor > 1:  # replica processes set the shm thread count
                assert r.process != ap.host and r.threads == threads
            elif cfg.num_actors > 1:  # an actor process running its policy sets it too
                assert r.process == ap.host and r.threads == threads
            else:  # the caller's threads are left alone
                assert r.process == MAIN and r.threads is None
    # main: hosts actor 0 when it is the only one, pinned to cores[0] while it has env workers
    assert p.main.actor == (0 if cfg.num_actors == 1 else None)
    assert p.main.cpus == ((min(cores),) if cfg.num_actors == 1 and cfg.env_parallel_degree > 1 else ())


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_every_env_is_stepped_by_exactly_one_process(cfg):
    p = plan_layout(cfg, cores=[0, 1])
    stepped = Counter(e for a in p.actors for s in a.env_shares for e in s.env_ids)
    assert sorted(stepped) == list(range(cfg.num_envs)) and set(stepped.values()) == {1}
    # ... and the process that steps a share holds exactly those envs.
    by_name = {q.name: q for q in (p.main, *p.processes)}
    for a in p.actors:
        for s in a.env_shares:
            assert by_name[s.process].env_ids == s.env_ids


class _Lane:
    def __init__(self, remote: bool):
        self.remote, self.name = remote, "fake"
        self.runner = types.SimpleNamespace(act_slice=lambda *a: None, step_slice=lambda *a: None)

    def submit(self, ts, ids):  # never called: only the constructor runs
        raise AssertionError


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_the_actor_loop_runs_the_plans_lockstep_choice(cfg):
    """ActorLoop built as ActorHost builds it (share 0 local, replicas remote unless one):
    lockstep exactly when the plan says so, and a lockstep the lanes cannot run is refused."""
    for ap in plan_layout(cfg, cores=[0, 1]).actors:
        env_lanes = [_Lane(remote=d > 0) for d in range(cfg.env_parallel_degree)]
        pol_lanes = [_Lane(remote=cfg.policies_per_actor > 1) for _ in range(cfg.policies_per_actor)]
        loop = ActorLoop(ap.env_ids, env_lanes, pol_lanes, cfg.policy_batch_size, lambda: [], lambda r: object(),
                         lockstep=ap.lockstep)
        assert ap.lockstep == (loop._lockstep is not None)
        # the plan's rule, restated: one in-process replica whose batch holds all the actor's envs
        assert ap.lockstep == (cfg.policies_per_actor == 1 and cfg.policy_batch_size >= cfg.envs_per_actor)
        if not ap.lockstep:
            with pytest.raises(ValueError, match="lockstep needs one in-process policy lane"):
                ActorLoop(ap.env_ids, env_lanes, pol_lanes, cfg.policy_batch_size, lambda: [], lambda r: object(),
                          lockstep=True)


OVERLAP_CASES = CONFIGS + [
    Config(envs_per_actor=8, env_parallel_degree=4, policies_per_actor=2, policy_device="cuda", policy_batch_size=4),
    Config(envs_per_actor=8, env_parallel_degree=2, policy_device="cuda", policy_batch_size=4),  # own replica
    Config(envs_per_actor=8, env_parallel_degree=2, policy_device="cuda"),  # lockstep
    Config(num_actors=2, envs_per_actor=4, policies_per_actor=2, policy_device="cuda:1", policy_batch_size=2),
    Config(num_actors=2, envs_per_actor=4, env_parallel_degree=4, policies_per_actor=2, policy_batch_size=2),  # cpu
]


@pytest.mark.parametrize("cfg", OVERLAP_CASES, ids=str)
def test_the_actor_loop_overlaps_exactly_when_the_plan_says(cfg):
    """The overlap rule, restated: a policy on a device, env workers, and not lockstep; the
    loop built as ActorHost builds it then queues tasks on its remote lanes (TaskQueues), and
    only then."""
    for backend_cores in ([0, 1], None):
        for ap in plan_layout(cfg, cores=backend_cores).actors:
            want = (cfg.policy_device != "cpu" and cfg.env_parallel_degree > 1
                    and not (cfg.policies_per_actor == 1 and cfg.policy_batch_size >= cfg.envs_per_actor))
            assert ap.overlap == want and not (ap.overlap and ap.lockstep)
            env_lanes = [_Lane(remote=d > 0) for d in range(cfg.env_parallel_degree)]
            pol_lanes = [_Lane(remote=cfg.policies_per_actor > 1) for _ in range(cfg.policies_per_actor)]
            made = []
            loop = ActorLoop(ap.env_ids, env_lanes, pol_lanes, cfg.policy_batch_size, lambda: [], lambda r: object(),
                             lockstep=ap.lockstep, overlap=ap.overlap,
                             task_queues=lambda envs, pols: made.append((envs, pols)) or object())
            assert (loop._queues is not None) == ap.overlap
            if ap.overlap:  # every remote lane is the queues', share 0 and a lone replica stay in the actor
                assert made == [(env_lanes[1:], [p for p in pol_lanes if p.remote])]
    ray = plan_layout(Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2,
                             policy_device="cuda", policy_batch_size=2),
                      cluster=ClusterResources(node_cpus=(16,), node_gpus=(2,)))
    assert all(ap.overlap for ap in ray.actors)  # a Ray actor's own shm executor overlaps the same way


def test_hand_worked_two_actors():
    cfg = Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2)
    p = plan_layout(cfg, cores=[3, 1, 2])  # any order: pins index the sorted cores
    assert [(q.name, q.cpus, q.threads) for q in p.processes] == [
        ("actor 0 (envs 0-3)", (1,), None),
        ("actor 1 (envs 4-7)", (3,), None),
        ("env worker 1 of actor 0 (envs 2-3)", (2,), None),
        ("policy replica 0 of actor 0 (envs 0-3) on cpu", (), 1),  # (3 cores - 2 env workers) // 4 replicas -> 1
        ("policy replica 1 of actor 0 (envs 0-3) on cpu", (), 1),
        ("env worker 1 of actor 1 (envs 6-7)", (1,), None),
        ("policy replica 0 of actor 1 (envs 4-7) on cpu", (), 1),
        ("policy replica 1 of actor 1 (envs 4-7) on cpu", (), 1),
    ]
    assert p.actors[1].env_shares[0].env_ids == (4, 5) and not p.actors[1].lockstep
    assert [r.process for r in p.actors[1].replicas] == ["policy replica 0 of actor 1 (envs 4-7) on cpu",
                                                         "policy replica 1 of actor 1 (envs 4-7) on cpu"]


def test_hand_worked_threads_and_lockstep():
    # one actor, its own policy, 3 env workers on 16 cores: main is not given threads
    p = plan_layout(Config(envs_per_actor=8, env_parallel_degree=4), cores=range(16))
    assert p.actors[0].lockstep and p.actors[0].replicas[0].threads is None
    assert [q.cpus for q in p.processes] == [(1,), (2,), (3,)] and p.main.cpus == (0,)
    # two replicas, batch below the envs: (16 - 0) // 2 = 8 threads each, no lockstep
    p = plan_layout(Config(envs_per_actor=8, policies_per_actor=2, policy_batch_size=4), cores=range(16))
    assert [q.threads for q in p.processes] == [8, 8] and not p.actors[0].lockstep and p.main.cpus == ()
    # one replica but a batch smaller than the envs: the general loop
    assert not plan_layout(Config(envs_per_actor=8, policy_batch_size=4), cores=[0]).actors[0].lockstep
    # more env workers than cores wrap around
    p = plan_layout(Config(envs_per_actor=4, env_parallel_degree=4), cores=[0, 1])
    assert [q.cpus for q in p.processes] == [(1,), (0,), (1,)]


def test_an_actor_running_its_cpu_policy_has_cores_for_its_threads():
    # Pinned to its lane's core alone, an actor's 8 planned threads shared one core and its
    # thread rule (1 against the cores it may use) kept 1.
    p = plan_layout(Config(num_actors=2, envs_per_actor=32, policy_batch_size=32), cores=range(16))
    assert [(q.cpus, q.threads) for q in p.processes] == [((0, 2, 3, 4, 5, 6, 7, 8), 8),
                                                          ((1, 9, 10, 11, 12, 13, 14, 15), 8)]
    # 2 x 4 lanes on 8 of 16 cores: 5 threads each, the lane's core and 4 free ones
    p = plan_layout(Config(num_actors=2, envs_per_actor=8, env_parallel_degree=4), cores=range(16))
    assert [(q.cpus, q.threads) for q in p.processes if q.kind == "actor"] == [((0, 8, 9, 10, 11), 5),
                                                                               ((4, 12, 13, 14, 15), 5)]
    # On a device, or with replica processes, or with every core holding a lane: the lane's core only
    for cfg, cores in [(Config(num_actors=2, envs_per_actor=32, policy_batch_size=32, policy_device="cuda"), range(16)),
                       (Config(num_actors=2, envs_per_actor=4, policies_per_actor=2, policy_batch_size=2), range(16)),
                       (Config(num_actors=2, envs_per_actor=4, policy_batch_size=4), [0, 1])]:
        assert [q.cpus for q in plan_layout(cfg, cores=cores).processes if q.kind == "actor"] == [(0,), (1,)]


@pytest.mark.parametrize("actors,degree", [(8, 2), (4, 4), (2, 8), (3, 8), (2, 16), (5, 3)])
def test_lanes_spread_over_every_core_of_a_big_machine(actors, degree):
    # Pinning actor a's lanes to the cores after core a put 8 x 2 on 9 of 16 cores.
    cfg = Config(num_actors=actors, envs_per_actor=degree, env_parallel_degree=degree, policy_device="cuda")
    p = plan_layout(cfg, cores=range(16))
    _check_spread(p, cfg, list(range(16)))
    used = {q.cpus[0] for q in p.processes if q.kind in ("actor", "env")}
    assert len(used) == min(16, actors * degree)


def test_hand_worked_spread():
    p = plan_layout(Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2), cores=[0, 1])
    assert [(q.kind, q.cpus) for q in p.processes] == [("actor", (0,)), ("actor", (1,)), ("env", (1,)), ("env", (0,))]
    p = plan_layout(Config(num_actors=3, envs_per_actor=8, env_parallel_degree=8), cores=range(16))
    assert [q.cpus[0] for q in p.processes if q.kind == "actor"] == [0, 8, 1]
    assert [q.cpus[0] for q in p.processes if q.kind == "env" and q.actor == 2] == [2, 3, 4, 5, 6, 7, 8]


def test_cuda_device_string_reaches_replicas_and_ray_sees_cuda():
    cfg = Config(num_actors=2, envs_per_actor=4, policies_per_actor=2, policy_device="cuda:1", policy_batch_size=2)
    p = plan_layout(cfg, cores=[0, 1])
    assert {q.device for q in p.processes if q.kind == "policy"} == {"cuda:1"}
    assert {q.threads for q in p.processes if q.kind == "policy"} == {1}
    assert p.processes[-1].name == "policy replica 1 of actor 1 (envs 4-7) on cuda:1"
    r = plan_layout(cfg, cluster=ClusterResources((8,), (2,)))
    assert {q.device for q in r.processes if q.kind == "policy"} == {"cuda"}
    assert r.actors[0].ray.node_config == Config(1, 4, 1, 2, "cuda", 2)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_ray_plan_follows_the_current_rules(cfg):
    p = plan_layout(cfg, cluster=ClusterResources((64,), (8,)))
    gpus = 0 if cfg.policy_device == "cpu" else 1
    assert p.backend == "ray" and p.main.actor is None
    assert p.num_processes == cfg.num_actors * cfg.processes_per_actor
    for ap in p.actors:
        # as RayExecutor._apply_config builds the bundle and the sub-config
        assert ap.ray.bundle == {"CPU": cfg.processes_per_actor, **({"GPU": gpus} if gpus else {})}
        assert ap.ray.node_config == Config(1, cfg.envs_per_actor, cfg.env_parallel_degree, cfg.policies_per_actor,
                                            "cpu" if not gpus else "cuda", cfg.policy_batch_size)
        assert ap.host.startswith(f"ray actor {ap.index} ") and ap.processes[0].name == ap.host
        assert len(ap.processes) == cfg.processes_per_actor
        assert all(q.cpus is None for q in ap.processes if q.kind != "policy")  # not placed yet


def test_ray_plan_with_placed_cores_pins_as_a_one_actor_shm_executor():
    cfg = Config(num_actors=2, envs_per_actor=4, env_parallel_degree=4)
    wheres = {0: {"node": "n", "cores": [0, 1, 2, 3, 4, 5, 6, 7]}, 1: {"node": "n", "cores": [0, 1, 2, 3, 4, 5, 6, 7]}}
    cores = ray_actor_cores(wheres, cfg.processes_per_actor)
    assert cores == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    ap = plan_layout(cfg, cores=cores, cluster=ClusterResources((8,))).actors[1]
    assert [(q.name, q.cpus) for q in ap.processes] == [
        ("ray actor 1 (envs 4-7)", (4,)), ("env worker 1 of ray actor 1 (envs 5-5)", (5,)),
        ("env worker 2 of ray actor 1 (envs 6-6)", (6,)), ("env worker 3 of ray actor 1 (envs 7-7)", (7,))]


def test_ray_actor_cores_on_uneven_nodes():
    wheres = {0: {"node": "a", "cores": [0, 1, 2]}, 1: {"node": "b", "cores": [0, 1]},
              2: {"node": "a", "cores": [0, 1, 2]}, 3: {"node": "c", "cores": [0, 1, 2, 3]}}
    # node a holds actors 0 and 2, one core each; an actor alone on its node is not pinned
    assert ray_actor_cores(wheres, 1) == {0: [0], 2: [1], 1: None, 3: None}
    assert ray_actor_cores(wheres, 2) == {0: None, 2: None, 1: None, 3: None}  # 2 x 2 > 3 cores on node a


def test_bad_cores_name_the_fix():
    with pytest.raises(ValueError, match="cores is empty"):
        plan_layout(Config.serial(2), cores=[])
    with pytest.raises(ValueError, match="ray backend"):
        plan_layout(Config.serial(2), cores={0: [0]})


def test_default_cores_are_this_process_affinity():
    p = plan_layout(Config(envs_per_actor=4, env_parallel_degree=2))
    assert p.cores == tuple(sorted(usable_cores_set()))


def test_resources_match_the_existing_definitions():
    assert usable_cores() == space_mod.usable_cores()
    assert cuda_device_count() == space_mod._cuda_device_count()


# ----------------------------------------------------------------------------- diff
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_identical_configs_keep_everything(cfg):
    d = plan_layout(cfg, cores=[0, 1]).diff(plan_layout(cfg, cores=[0, 1]))
    assert len(d.kept) == cfg.num_processes and not d.started and not d.ended and not d.moved
    assert not d.main_changed and d.unchanged


def test_degree_two_to_four_keeps_the_actors_and_starts_workers():
    two = Config(num_actors=2, envs_per_actor=8, env_parallel_degree=2)
    old, new = plan_layout(two, cores=[0, 1]), plan_layout(two.replace(env_parallel_degree=4), cores=[0, 1])
    d = old.diff(new)
    assert [o.name for o, _ in d.kept] == ["actor 0 (envs 0-7)", "actor 1 (envs 8-15)"]
    assert [q.name for q in d.ended] == ["env worker 1 of actor 0 (envs 4-7)", "env worker 1 of actor 1 (envs 12-15)"]
    assert len(d.started) == 6 and {q.kind for q in d.started} == {"env"}
    # actor 0 hands envs 2-3 to its new worker 1; old worker 1's envs go to new workers 2 and 3
    moves = {m.env_id: (m.source, m.target) for m in d.moved}
    assert sorted(moves) == [2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]
    assert moves[2] == ("actor 0 (envs 0-7)", "env worker 1 of actor 0 (envs 2-3)")
    assert moves[6] == ("env worker 1 of actor 0 (envs 4-7)", "env worker 3 of actor 0 (envs 6-7)")
    assert not d.main_changed and d.summary() == "processes kept 2, started 6, ended 2; envs moved 12"
    # on 8 cores the actors' own CPU policies go from (8 - 2) // 2 = 3 torch threads to 1: a new role
    d = plan_layout(two, cores=range(8)).diff(plan_layout(two.replace(env_parallel_degree=4), cores=range(8)))
    assert not d.kept and [q.threads for q in d.started if q.kind == "actor"] == [1, 1]


def test_envs_coming_back_to_the_actor_are_moves_and_kept_workers_are_not():
    old = plan_layout(Config(envs_per_actor=4, env_parallel_degree=4), cores=[0, 1])
    new = plan_layout(Config(envs_per_actor=4, env_parallel_degree=2), cores=[0, 1])
    d = old.diff(new)
    assert d.kept == () and len(d.ended) == 3 and len(d.started) == 1
    assert d.moved == (EnvMove(1, "env worker 1 of actor 0 (envs 1-1)", MAIN),
                       EnvMove(2, "env worker 2 of actor 0 (envs 2-2)", "env worker 1 of actor 0 (envs 2-3)"),
                       EnvMove(3, "env worker 3 of actor 0 (envs 3-3)", "env worker 1 of actor 0 (envs 2-3)"))
    # a batch change moves nothing and keeps every process
    b = plan_layout(Config(envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2),
                    cores=[0, 1])
    c = plan_layout(Config(envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1),
                    cores=[0, 1])
    assert b.diff(c).unchanged and len(b.diff(c).kept) == 3


def test_a_device_change_restarts_replicas():
    cpu = Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2)
    old, new = plan_layout(cpu, cores=[0, 1]), plan_layout(cpu.replace(policy_device="cuda"), cores=[0, 1])
    d = old.diff(new)
    assert {q.kind for q in d.ended} == {q.kind for q in d.started} == {"policy"} and len(d.started) == 4
    assert {o.kind for o, _ in d.kept} == {"actor", "env"} and not d.moved
    # one replica in an actor process: the actor process itself restarts, its envs move with it
    one = Config(num_actors=2, envs_per_actor=2)
    d = plan_layout(one, cores=[0, 1]).diff(plan_layout(one.replace(policy_device="cuda"), cores=[0, 1]))
    assert len(d.ended) == len(d.started) == 2 and len(d.moved) == 4
    # in the caller's process nothing restarts: the change is done in place
    d = plan_layout(Config.serial(4), cores=[0]).diff(plan_layout(Config.serial(4, "cuda"), cores=[0]))
    assert d.main_changed and not (d.kept or d.started or d.ended or d.moved)


def test_a_thread_count_change_restarts_cpu_replicas_and_pins_are_reported():
    cfg = Config(envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2)
    d = plan_layout(cfg, cores=range(4)).diff(plan_layout(cfg, cores=range(8)))  # 1 thread -> 3 threads each
    assert {q.kind for q in d.ended} == {"policy"} and len(d.started) == 2
    d = plan_layout(cfg, cores=[0, 1, 2, 3]).diff(plan_layout(cfg, cores=[0, 2, 4, 6]))  # same count, other cores
    assert len(d.kept) == 3 and [(o.cpus, n.cpus) for o, n in d.repinned] == [((1,), (2,))]
    assert not d.unchanged
