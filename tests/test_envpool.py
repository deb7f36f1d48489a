"""EnvPoolRunner: same data and semantics as EnvRunner, backed by one EnvPool."""
from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

envpool = pytest.importorskip("envpool")

from auturi.envs.envpool import EnvPoolEnv, EnvPoolRunner, EnvPoolSource, to_int32_seed  # noqa: E402
from auturi.envs import env_seed  # noqa: E402
from auturi.executor.env_runner import EnvRunner  # noqa: E402

CARTPOLE = EnvPoolSource("CartPole-v1")
SHORT_LEN = 15  # random actions end CartPole episodes in about 10 to 40 steps
SHORT = EnvPoolSource("envpool:CartPole-v1", max_episode_steps=SHORT_LEN)  # truncations and terminations
KEYS = ("obs", "starts", "rewards", "terminated", "truncated")


def make_arrays(source: EnvPoolSource, T: int, N: int, action_seed: int = 0) -> dict[str, np.ndarray]:
    obs_space, act_space = source.observation_space, source.action_space
    rng = np.random.default_rng(action_seed)
    if act_space.shape:
        actions = rng.uniform(act_space.low, act_space.high, (T, N, *act_space.shape)).astype(act_space.dtype)
    else:
        actions = rng.integers(0, act_space.n, (T, N))
    return {
        "obs": np.zeros((T + 1, N, *obs_space.shape), obs_space.dtype),
        "starts": np.zeros((T + 1, N), bool),
        "actions": actions,
        "rewards": np.full((T, N), np.nan),
        "terminated": np.zeros((T, N), bool),
        "truncated": np.zeros((T, N), bool),
    }


def run_all(runner, arrays: dict[str, np.ndarray], close: bool = True):
    """Step every env of ``runner`` together, row after row; returns the finals."""
    T = arrays["actions"].shape[0]
    try:
        runner.bind(arrays)
        runner.reset_all()
        for t in range(T):
            runner.step([t] * len(runner.env_ids), runner.env_ids)
        return runner.take_finals()
    finally:
        if close:
            runner.close()


def collect(source: EnvPoolSource, N: int, T: int, seed: int, generation: int = 0, action_seed: int = 0):
    arrays = make_arrays(source, T, N, action_seed)
    finals = run_all(EnvPoolRunner(range(N), source, seed, generation), arrays)
    return arrays, finals


def assert_same(x: dict, y: dict, cols=slice(None)) -> None:
    for k in KEYS:
        np.testing.assert_array_equal(x[k][:, cols], y[k][:, cols], err_msg=k)


def assert_same_finals(f: dict, g: dict) -> None:
    """Same final observations and infos; an EnvPoolEnv's info has no ``env_id`` (it does
    not know its global index), the runner's is the global index."""
    assert f.keys() == g.keys()
    for key in f:
        np.testing.assert_array_equal(f[key][0], g[key][0])
        fi, gi = dict(f[key][1]), dict(g[key][1])
        for info in (fi, gi):
            assert info.pop("env_id", key[1]) == key[1]
        assert fi == gi, key


def raw_reference(T: int, N: int, seed: int, actions: np.ndarray, **make_kwargs):
    """Each env on its own: a one-env EnvPool made with envpool's own base seed ``seed + i``,
    stepped with envpool's native next-step auto-reset turned into SB3's by hand."""
    obs = np.zeros((T + 1, N, 4), np.float32)
    starts = np.zeros((T + 1, N), bool)
    rewards = np.zeros((T, N))
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    finals = {}
    for i in range(N):
        pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=1, seed=seed + i, **make_kwargs)
        o, _ = pool.reset()
        obs[0, i], starts[0, i] = o[0], True
        for t in range(T):
            o, r, te, tr, info = pool.step(np.array([actions[t, i]], dtype=np.int32))
            rewards[t, i], term[t, i], trunc[t, i] = r[0], te[0], tr[0]
            if te[0] or tr[0]:
                finals[(t, i)] = (o[0].copy(), int(info["elapsed_step"][0]))
                o = pool.step(np.array([1], dtype=np.int32))[0]  # envpool's reset step: action ignored
                starts[t + 1, i] = True
            obs[t + 1, i] = o[0]
        pool.close()
    return {"obs": obs, "starts": starts, "rewards": rewards, "terminated": term, "truncated": trunc}, finals


# ---------------------------------------------------------------------------- (a) reference
@pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")  # envpool's own float64 Box bounds
@pytest.mark.parametrize("source,kw", [(CARTPOLE, {}), (SHORT, {"max_episode_steps": SHORT_LEN})])
def test_matches_raw_envpool_reference(source, kw):
    T, N, seed = 120, 6, 11
    got, finals = collect(source, N, T, seed)
    ref, ref_finals = raw_reference(T, N, seed, got["actions"], **kw)
    assert_same(got, ref)
    assert ref["starts"][1:].sum() >= 10, "the run must cross episode ends"
    assert finals.keys() == ref_finals.keys()
    for key, (o, elapsed) in ref_finals.items():
        np.testing.assert_array_equal(finals[key][0], o)
        assert finals[key][1] == {"env_id": key[1], "elapsed_step": elapsed}


def test_matches_env_runner_over_single_envpool_envs():
    """EnvRunner with one EnvPoolEnv per env (its own one-env pool, seeded by reset(seed=...))."""
    T, N, seed = 80, 5, 3
    got, finals = collect(SHORT, N, T, seed)
    ref = make_arrays(SHORT, T, N)
    ref_finals = run_all(EnvRunner(range(N), [SHORT] * N, seed), ref)
    assert_same(got, ref)
    assert_same_finals(finals, ref_finals)


@pytest.mark.parametrize("source,act_dtype", [(SHORT, None), (EnvPoolSource("Pendulum-v1", max_episode_steps=7),
                                                                   np.float64)], ids=["cartpole", "pendulum"])
def test_public_api_path_gives_the_same_data(source, act_dtype):
    """The runner drives EnvPool's C++ ``_send``/``_recv`` directly when it can; the public
    ``send``/``recv`` path (its fallback) must give the same data. Actions of a dtype other
    than EnvPool's (int64 for its int32 CartPole action, float64 for its float32 Pendulum
    one, as a policy may emit) reach the C++ envs as EnvPool's own ``send`` casts them."""
    T, N, seed = 60, 5, 6

    def arrays_of():
        a = make_arrays(source, T, N)
        if act_dtype is not None:
            a["actions"] = a["actions"].astype(act_dtype) * 1.3  # some beyond the bounds: cast, not clipped
        return a

    fast = arrays_of()
    fast_finals = run_all(EnvPoolRunner(range(N), source, seed), fast)
    arrays = arrays_of()
    runner = EnvPoolRunner(range(N), source, seed)
    assert runner._io.raw  # CartPole and Pendulum have the plain layout
    assert fast["actions"].dtype != runner._io.act_dtype
    runner._io.raw = False
    slow_finals = run_all(runner, arrays)
    assert_same(arrays, fast)
    assert_same_finals(slow_finals, fast_finals)
    assert fast_finals


def test_box_actions_pendulum():
    src = EnvPoolSource("Pendulum-v1", max_episode_steps=7)
    T, N, seed = 30, 3, 5
    got, finals = collect(src, N, T, seed)
    assert got["actions"].shape == (T, N, 1)
    ref = make_arrays(src, T, N)
    ref_finals = run_all(EnvRunner(range(N), [src] * N, seed), ref)
    assert_same(got, ref)
    assert_same_finals(finals, ref_finals)
    assert len(finals) == N * (T // 7) and got["truncated"].sum() == len(finals)


# ---------------------------------------------------------------------------- (b) subsets
def test_subsets_in_any_order_give_the_same_data():
    T, N, seed = 60, 7, 2
    want, want_finals = collect(SHORT, N, T, seed)
    rng = np.random.default_rng(0)
    for trial in range(3):
        arrays = make_arrays(SHORT, T, N)
        runner = EnvPoolRunner(range(N), SHORT, seed)
        runner.bind(arrays)
        runner.reset_all()
        t_of = np.zeros(N, dtype=int)  # envs drift apart: each is at its own row
        while (t_of < T).any():
            live = np.flatnonzero(t_of < T)
            pick = rng.permutation(live)[: rng.integers(1, len(live) + 1)]
            if trial == 0:
                pick = pick[:1]  # one env at a time
            runner.step(t_of[pick].tolist(), pick.tolist())
            t_of[pick] += 1
        finals = runner.take_finals()
        runner.close()
        assert_same(arrays, want)
        assert_same_finals(finals, want_finals)


def test_layout_independence_non_contiguous_ids():
    """A runner holding envs [5, 2, 7] gives those envs' columns of a runner holding all 8."""
    T, N, seed = 50, 8, 4
    want, want_finals = collect(SHORT, N, T, seed)
    ids = [5, 2, 7]
    arrays = make_arrays(SHORT, T, N)
    finals = run_all(EnvPoolRunner(ids, SHORT, seed), arrays)
    assert_same(arrays, want, cols=ids)
    assert finals == {} or set(k[1] for k in finals) <= set(ids)
    assert_same_finals(finals, {k: v for k, v in want_finals.items() if k[1] in ids})


# ---------------------------------------------------------------------------- (c) auto-reset
def test_sb3_auto_reset():
    T, N = 60, 4
    a, finals = collect(SHORT, N, T, seed=9)
    assert a["starts"][0].all()
    ends = a["terminated"] | a["truncated"]
    np.testing.assert_array_equal(a["starts"][1:], ends)
    assert set(finals) == {(int(t), int(i)) for t, i in zip(*np.nonzero(ends))}
    assert a["truncated"].any() and a["terminated"].any()
    assert not (a["terminated"] & a["truncated"]).any()
    last_start = np.zeros(N, dtype=int)
    for (t, i), (final_obs, info) in sorted(finals.items()):
        length = t + 1 - last_start[i]
        last_start[i] = t + 1
        assert info == {"env_id": i, "elapsed_step": length}
        assert a["truncated"][t, i] == (length == SHORT_LEN)
        assert not np.array_equal(final_obs, a["obs"][t + 1, i])
        assert np.all(np.abs(a["obs"][t + 1, i]) <= 0.05), "obs[t+1] must be the reset observation"
        if a["terminated"][t, i]:  # CartPole ends when the pole or cart leaves its bounds
            assert abs(final_obs[2]) > 0.2094 or abs(final_obs[0]) > 2.4
    assert np.all(a["rewards"] == 1.0)


def test_take_finals_hands_over_once_and_reset_all_reseeds():
    T, N = 30, 3
    arrays = make_arrays(SHORT, T, N)
    runner = EnvPoolRunner(range(N), SHORT, 1)
    try:
        finals = run_all(runner, arrays, close=False)
        assert finals and runner.take_finals() == {}
        first = arrays["obs"].copy()
        again = make_arrays(SHORT, T, N)
        run_all(runner, again, close=False)  # a second reset_all starts again from the seeds
        np.testing.assert_array_equal(again["obs"], first)
        with pytest.raises(KeyError):
            runner.step([0], [N])
        with pytest.raises(ValueError):
            runner.step([0, 0], [1, 1])
    finally:
        runner.close()
    runner.close()  # idempotent


# ---------------------------------------------------------------------------- (d) seeding
def test_seeding():
    T, N = 40, 4
    a, fa = collect(CARTPOLE, N, T, seed=7)
    b, fb = collect(CARTPOLE, N, T, seed=7)
    c, _ = collect(CARTPOLE, N, T, seed=8)
    assert_same(a, b)
    assert_same_finals(fa, fb)
    assert not np.array_equal(a["obs"][0], c["obs"][0])
    # generation 0 is seed + i: env i of seed 7 is env i - 1 of seed 8
    np.testing.assert_array_equal(a["obs"][0, 1:], c["obs"][0, :-1])
    # the pool's seeds are exactly what EnvRunner would pass to reset(seed=...)
    g0 = EnvPoolRunner([3, 1], CARTPOLE, 7)
    g2 = EnvPoolRunner([3, 1], CARTPOLE, 7, generation=2)
    try:
        assert g0.pool.config["env_seed"] == [10, 8]
        assert g2.pool.config["env_seed"] == [to_int32_seed(env_seed(7, i, 2)) for i in (3, 1)]
    finally:
        g0.close()
        g2.close()


def test_later_generations_are_fresh_and_layout_independent():
    T, N = 30, 4
    g0, _ = collect(SHORT, N, T, seed=7)
    g1, f1 = collect(SHORT, N, T, seed=7, generation=1)
    assert not np.array_equal(g0["obs"][0], g1["obs"][0])
    ref = make_arrays(SHORT, T, N)
    ref_finals = run_all(EnvRunner(range(N), [SHORT] * N, 7, 1), ref)
    assert_same(g1, ref)
    assert_same_finals(f1, ref_finals)


def test_int32_wrap():
    assert to_int32_seed(5) == 5
    assert to_int32_seed(2**31) == -(2**31)
    assert to_int32_seed(2**32 - 1) == -1
    assert to_int32_seed(-1) == -1


# ---------------------------------------------------------------------------- source
def test_source_is_small_picklable_and_checked():
    src = EnvPoolSource("envpool:CartPole-v1", max_episode_steps=SHORT_LEN)
    assert src == SHORT and src.task_id == "CartPole-v1"
    assert src.observation_space.shape == (4,) and src.action_space.n == 2
    back = pickle.loads(pickle.dumps(src))
    assert back == src and back.observation_space == src.observation_space
    assert len(pickle.dumps(src)) < 300
    with pytest.raises(ValueError, match="unknown EnvPool task"):
        EnvPoolSource("CartPol-v1")
    with pytest.raises(ValueError, match="num_envs"):
        EnvPoolSource("CartPole-v1", num_envs=4)
    probe = src()
    assert isinstance(probe, EnvPoolEnv)
    try:
        obs, info = probe.reset(seed=3)
        assert src.observation_space.contains(obs) and info["elapsed_step"] == 0
    finally:
        probe.close()
    # EnvRunner's env_fns work as the runner's source too, when they all name one task
    r = EnvPoolRunner([0, 2], [SHORT] * 3, 0)
    r.close()
    with pytest.raises(TypeError):
        EnvPoolRunner([0], [lambda: None], 0)


def test_num_threads():
    r = EnvPoolRunner(range(3), CARTPOLE, 0)
    s = EnvPoolRunner(range(3), EnvPoolSource("CartPole-v1", num_threads=1), 0)
    try:
        assert r.pool.config["num_threads"] == min(3, r.num_threads) and r.num_threads >= 1
        assert s.pool.config["num_threads"] == 1
    finally:
        r.close()
        s.close()


def test_does_not_import_torch():
    code = ("import sys, auturi.envs.envpool as m; m.EnvPoolSource('CartPole-v1').observation_space; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_source_makes_its_runner():
    """``make_runner`` (what the executor's make_env_runner asks a source for) gives the
    EnvPoolRunner's data; a slice of a larger collection is refused, naming the way out."""
    T, N, seed = 40, 3, 7
    got = make_arrays(SHORT, T, N)
    runner = SHORT.make_runner([0, 1, 2], seed, generation=1)
    assert isinstance(runner, EnvPoolRunner) and runner.generation == 1
    finals = run_all(runner, got)
    ref, ref_finals = collect(SHORT, N, T, seed, generation=1)
    assert_same(got, ref)
    assert_same_finals(finals, ref_finals)
    with pytest.raises(NotImplementedError, match="use a gymnasium id"):
        SHORT.make_runner([0], seed, id_offset=2)


def test_the_old_module_name_still_imports_the_same_objects():
    import auturi.adapters.envpool as old

    assert old.EnvPoolSource is EnvPoolSource and old.EnvPoolRunner is EnvPoolRunner
    assert old.to_int32_seed is to_int32_seed and old.EnvPoolEnv is EnvPoolEnv
