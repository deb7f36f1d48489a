"""Reconfigure without losing anything (issue 15, item 2).

The contract: with envs that survive a pickle round trip, a rollout collected after any
number of reconfigures equals, bit for bit, the serial run that never reconfigured (the
policy is batch-independent); live processes whose role is unchanged stay alive; an env that
cannot move is recreated and its episode cut (row 0 starts a new one, with no done before it),
the others go on. ``last_reconfigure`` counts what happened."""
from __future__ import annotations

import functools
import os
import threading

import numpy as np
import pytest

from auturi import Config, WorkerError, make_executor
from auturi.envs import CountingEnv
from tests.helpers import ObsHashPolicy

try:  # the shared helpers are moving to tests/helpers.py (issue 14, item 4)
    from tests.helpers import assert_same
except ImportError:
    from tests.test_executor_contract import assert_same

N = 8
A = Config(envs_per_actor=8, env_parallel_degree=2)
PAIRS = [  # (from, to): one knob at a time, and a few that change everything
    (A, A.replace(env_parallel_degree=4)),
    (A, A.replace(policy_batch_size=4)),
    (A.replace(policies_per_actor=2, policy_batch_size=4), A.replace(policies_per_actor=2, policy_batch_size=2)),
    (A, Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2)),
    # actor processes kept with a new loop: lockstep (batch 4) -> the general loop (batch 2)
    (Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2),
     Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policy_batch_size=2)),
    (Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2),
     Config.serial(N)),
    (Config.serial(N), Config(num_actors=4, envs_per_actor=2, env_parallel_degree=2)),
    (Config(envs_per_actor=8, env_parallel_degree=8), Config(num_actors=2, envs_per_actor=4, policies_per_actor=2,
                                                             policy_batch_size=3)),
]
STEPS = (5, 9, 6)  # episodes (max_len 7) end mid-rollout and run across every reconfigure


def env_fn():
    return CountingEnv(max_len=7)


class LockedEnv(CountingEnv):
    """A CountingEnv holding a lock: it cannot be pickled, so it cannot move live."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lock = threading.Lock()


class FlagEnv(CountingEnv):
    """Fails to be made once the file ``flag`` exists."""

    def __init__(self, flag: str, **kw):
        if os.path.exists(flag):
            raise RuntimeError("FlagEnv: made after the flag was set, on purpose")
        super().__init__(**kw)


def collect_all(backend, configs, make=env_fn, seed=5):
    """One rollout per config, reconfiguring before each but the first; and each reconfigure's report."""
    with make_executor(make, ObsHashPolicy(make().action_space), num_envs=N, config=configs[0], backend=backend,
                       seed=seed) as ex:
        out, reports = [ex.collect(STEPS[0])], []
        for c, steps in zip(configs[1:], STEPS[1:]):
            ex.reconfigure(c)
            reports.append(dict(ex.last_reconfigure))
            out.append(ex.collect(steps))
        return out, reports, ex.envs_movable


@pytest.fixture(scope="module")
def reference():
    """The serial run that never reconfigures."""
    return collect_all("serial", [Config.serial(N)] * len(STEPS))[0]


@pytest.mark.parametrize("backend", ["serial", "shm"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].num_actors}x{p[0].env_parallel_degree}"
                         f"x{p[0].policies_per_actor}b{p[0].policy_batch_size}")
def test_rollouts_after_reconfigures_equal_the_serial_run(backend, pair, reference):
    got, reports, movable = collect_all(backend, [pair[0], pair[1], pair[0]])
    assert movable
    assert_same(got, reference)
    for r in reports:
        assert set(r) == {"seconds", "kept", "started", "ended", "moved", "recreated"}
        assert r["recreated"] == 0 and r["seconds"] > 0
    for before, after in zip(got, got[1:]):  # no episode was cut: row 0 starts one only after a done
        np.testing.assert_array_equal(after.episode_starts[0], before.last_episode_starts)


def test_counts_of_one_knob_changes():
    """Degree 2 -> 4 (one actor, in the caller): the old worker ends, three start, and the envs
    of the caller's share and of the old worker that change process move live. A batch change
    keeps every process and moves nothing."""
    _, reports, _ = collect_all("shm", [A, A.replace(env_parallel_degree=4), A.replace(env_parallel_degree=4,
                                                                                       policy_batch_size=4)])
    deg, batch = reports
    # envs 0-3 main, 4-7 worker -> 0-1 main, 2-3, 4-5, 6-7 workers: 2, 3 leave main; 4-7 change worker
    assert (deg["kept"], deg["started"], deg["ended"], deg["moved"], deg["recreated"]) == (0, 3, 1, 6, 0)
    assert (batch["kept"], batch["started"], batch["ended"], batch["moved"], batch["recreated"]) == (3, 0, 0, 0, 0)


def test_kept_processes_are_the_same_processes():
    """A batch change in a two-actor layout keeps every process: the actors rebuild their
    loops (REPLAN), their env workers and replicas are untouched."""
    two = Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2)
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, config=two, backend="shm") as ex:
        ex.collect(3)
        pids = {s.name: s.proc.pid for s in ex._slots}  # the backend's own record of its workers
        ex.reconfigure(two.replace(policy_batch_size=1))
        after = {s.name: s.proc.pid for s in ex._slots}
        r = ex.last_reconfigure
        ex.collect(3)
        ex.reconfigure(two.replace(policy_batch_size=1, env_parallel_degree=1))  # the actors' workers change
        again = {s.name: s.proc.pid for s in ex._slots}
        r2 = ex.last_reconfigure
    assert after == pids and len(pids) == 8
    assert (r["kept"], r["started"], r["ended"], r["moved"], r["recreated"]) == (8, 0, 0, 0, 0)
    # degree 2 -> 1: the env workers end, so do the actors (their lanes change); the replicas stay
    assert {n for n in again if again[n] == pids.get(n)} == {n for n in pids if n.startswith("policy")}
    assert (r2["kept"], r2["started"], r2["ended"], r2["moved"], r2["recreated"]) == (4, 2, 4, 8, 0)


class RebuiltEnv(CountingEnv):
    """A CountingEnv whose pickle rebuilds it from its constructor, as gymnasium's MuJoCo and
    ALE envs (``EzPickle``) do: a copy made mid-episode has lost the episode. Moved as a
    pickle, its episode went on from another state without a reset (HalfCheetah-v5's
    observations jumped by 5.7, 2026-11-26): the executor's probe finds that a copy steps
    differently, and such envs are recreated, their episodes cut, as unpicklable ones."""

    def __reduce__(self):
        return (functools.partial(RebuiltEnv, max_len=self.max_len), ())


@pytest.mark.parametrize("cls", [LockedEnv, RebuiltEnv])
def test_envs_that_cannot_move_are_recreated_and_their_episodes_cut(cls):
    make = functools.partial(cls, max_len=50)
    configs = [A, A.replace(env_parallel_degree=4)]
    got, (r,), movable = collect_all("shm", configs, make=make)
    assert not movable
    # envs 2-7 changed process: recreated, a new episode at row 0 without a done before it;
    # envs 0-1 stayed in the caller's runner and go on
    starts = got[1].episode_starts[0]
    assert starts.tolist() == [False, False, True, True, True, True, True, True]
    assert not got[0].last_episode_starts.any()
    np.testing.assert_array_equal(got[1].observations[0, :2], got[0].last_observations[:2])
    assert not np.array_equal(got[1].observations[0, 2:], got[0].last_observations[2:])
    assert (r["moved"], r["recreated"]) == (0, 6)  # 0-1 stay in the caller's process: not moves


def _pong():
    """ALE Pong with its RAM as the observation (small) and v5's sticky actions (the
    emulator's own random generator, which must move too)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", obs_type="ram", repeat_action_probability=0.25, max_episode_steps=40)


def test_atari_envs_move_with_their_emulators_state():
    """ale-py's AtariEnv pickles as its constructor's arguments (EzPickle): moved that way a
    game restarted, so the probe recreated Atari envs and every move cut their episodes.
    Moves now carry the emulator's state (its random generator included): the rollouts after
    reconfigures equal the serial run's, bit for bit, and no env is recreated. With seed 0
    the moves gave other data until they carried the action a sticky frame repeats too."""
    pytest.importorskip("ale_py")
    configs = [A, A.replace(env_parallel_degree=4), Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2)]
    ref = collect_all("serial", [Config.serial(N)] * len(STEPS), make=_pong, seed=0)[0]
    got, reports, movable = collect_all("shm", configs, make=_pong, seed=0)
    assert movable
    assert_same(got, ref)
    assert all(r["recreated"] == 0 for r in reports) and sum(r["moved"] for r in reports) > 0
    for before, after in zip(got, got[1:]):  # no episode was cut
        np.testing.assert_array_equal(after.episode_starts[0], before.last_episode_starts)


def test_a_sticky_atari_copy_repeats_the_action_its_original_would():
    """v5's sticky frames repeat the emulator's last action, which ``cloneState`` does not
    hold: a copy restored from it repeated a no-op, and after a moving action its game left
    the original's at its first step for seeds 2, 7, 10 and 11 of 0-11 (not for 0). The move
    now finds and carries that action; the copy steps as the original for 60 steps."""
    pytest.importorskip("ale_py")
    from auturi.executor.env_calls import _copy

    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    for seed in (0, 2, 7, 10, 11):
        env = gym.make("ALE/Pong-v5")
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for a in [*rng.integers(6, size=5), 2]:  # RIGHT last: a sticky frame repeats it
            env.step(int(a))
        twin = _copy(env)
        for t, a in enumerate(rng.integers(6, size=60)):
            mine, theirs = env.step(int(a)), twin.step(int(a))
            assert np.array_equal(mine[0], theirs[0]) and mine[1:4] == theirs[1:4], (seed, t)
        env.close()
        twin.close()


def test_an_atari_env_whose_state_a_move_cannot_carry_is_not_movable(monkeypatch):
    """Where the move's reduction fails, the plain pickle remakes the game from its start;
    the probe's one step need not tell (Pong's first frames are alike): not movable."""
    pytest.importorskip("ale_py")
    from auturi.executor import env_calls

    env = _pong()
    env.reset(seed=0)
    assert env_calls.travels_with_state(env, 0)

    def broken(env, state):
        raise RuntimeError("no state here")

    monkeypatch.setattr(env_calls, "_sticky_action", broken)
    assert not env_calls.travels_with_state(env, 0)
    env.close()


def test_reconfigure_before_the_first_collect_changes_no_data(reference):
    """Envs not reset yet are made anew where they go, with the same seeds."""
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, config=A, backend="shm",
                       seed=5) as ex:
        ex.reconfigure(Config(num_actors=2, envs_per_actor=4, env_parallel_degree=4))
        assert ex.last_reconfigure["recreated"] == 0
        got = [ex.collect(s) for s in STEPS]
    assert_same(got, reference)


def test_a_worker_failing_to_start_during_a_reconfigure_leaves_nothing(tmp_path):
    """The old worker was told to leave when the new ones failed: close() still ends it (the
    autouse fixture checks that no process, segment or semaphore name is left)."""
    flag = tmp_path / "fail"
    make = functools.partial(FlagEnv, flag=str(flag))
    ex = make_executor(make, ObsHashPolicy(CountingEnv().action_space), num_envs=N, config=A, backend="shm")
    flag.touch()  # envs not reset yet are made anew where they go: from now on that fails
    with pytest.raises(WorkerError, match="env worker"):
        ex.reconfigure(A.replace(env_parallel_degree=4))
    with pytest.raises(Exception, match="closed"):
        ex.collect(1)


class ThreadsPolicy(ObsHashPolicy):
    """Reports its process's torch thread count as the value of every env (``needs_torch``
    False: the runner's thread rule leaves the count as the process has it)."""

    needs_torch = False

    def __setstate__(self, state):  # a replica imports torch as it loads the policy, as a real one does
        import torch  # noqa: F401

        self.__dict__.update(state)

    def act(self, obs, noise):
        import torch

        actions, extras = super().act(obs, noise)
        extras["values"] = np.full(len(obs), torch.get_num_threads(), np.float32)
        return actions, extras


def test_a_kept_replica_gets_its_new_thread_count(monkeypatch):
    """On 8 cores, 2 replicas: degree 1 gives each 8 // 2 = 4 torch threads, degree 2
    (8 - 1) // 2 = 3. The replicas stay alive and are told the new count."""
    pytest.importorskip("torch")
    import auturi.executor.shm.executor as shm_executor
    from auturi.executor.layout import plan_layout

    monkeypatch.setattr(shm_executor, "plan_layout", lambda config: plan_layout(config, cores=range(8)))
    one = Config(envs_per_actor=8, policies_per_actor=2, policy_batch_size=4)
    with make_executor(env_fn, ThreadsPolicy(env_fn().action_space), num_envs=N, config=one, backend="shm") as ex:
        before = ex.collect(2).extras["values"]
        replicas = {s.name: s.proc.pid for s in ex._slots if s.kind == "policy"}
        ex.reconfigure(one.replace(env_parallel_degree=2))
        after = ex.collect(2).extras["values"]
        assert {s.name: s.proc.pid for s in ex._slots if s.kind == "policy"} == replicas
        assert ex.last_reconfigure["kept"] == 2
    assert (before == 4).all() and (after == 3).all()


@pytest.mark.parametrize("first, second", [(Config.serial(N), A), (A, Config.serial(N))], ids=["from-main", "from-worker"])
def test_an_env_that_fails_to_pickle_when_moving_is_recreated_and_counted(first, second):
    """The start-up probe said envs move (forced here), but these cannot be pickled: each one
    leaving its process is recreated with a new seed and its episode cut, never made anew
    silently as if it had not started."""
    make = functools.partial(LockedEnv, max_len=50)
    with make_executor(make, ObsHashPolicy(make().action_space), num_envs=N, config=first, backend="shm") as ex:
        ex.envs_movable = True
        before = ex.collect(3)
        ex.reconfigure(second)
        r = ex.last_reconfigure
        after = ex.collect(3)
    assert (r["moved"], r["recreated"]) == (0, 4)
    assert not before.last_episode_starts.any()
    assert after.episode_starts[0].tolist() == [False] * 4 + [True] * 4  # envs 4-7 changed process


@pytest.mark.parametrize("away", [Config(num_actors=2, envs_per_actor=2),
                                  Config(num_actors=1, envs_per_actor=4, policies_per_actor=2, policy_batch_size=2)],
                         ids=["actors", "replicas"])
def test_weights_published_while_the_policy_ran_elsewhere_reach_the_callers_copy(away):
    """Weights set while no replica ran in the caller must be what the caller's own copy acts
    with after a reconfigure brings the policy back (it acted with stale weights)."""
    from auturi import make_executor
    from auturi.envs import CountingEnv
    from tests.helpers import ObsHashPolicy

    policy = ObsHashPolicy(CountingEnv().action_space)
    with make_executor(CountingEnv, policy, num_envs=4, config=Config.serial(4), backend="shm", seed=0) as ex:
        ex.collect(4)
        ex.reconfigure(away)
        ex.set_policy_state({"w": np.asarray(100.0)})
        def weight(r):  # ObsHashPolicy: values = h / 2 + w, log_probs = -h
            return r.extras["values"].astype(np.float64) + r.extras["log_probs"] / 2

        np.testing.assert_allclose(weight(ex.collect(4)), 100.0, atol=1e-3)  # the replicas elsewhere got them
        ex.reconfigure(Config.serial(4))
        np.testing.assert_allclose(weight(ex.collect(4)), 100.0, atol=1e-3)  # ... and so does the caller's copy
