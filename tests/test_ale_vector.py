"""AleVectorRunner (ale-py's AtariVectorEnv): the EnvPool side's contract -- same data and
semantics as EnvRunner, in every layout, whatever subset of envs a step names."""
from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ale_py.vector_env", reason="needs ale-py >= 0.11 (AtariVectorEnv)")

from auturi import Config, make_executor  # noqa: E402
from auturi.envs import AleVectorSource, env_seed, resolve_env_fns  # noqa: E402
from auturi.envs.ale_vector import AleVectorEnv, AleVectorRunner, ale_game, ale_seed  # noqa: E402
from auturi.executor.env_runner import EnvRunner  # noqa: E402
from tests.helpers import ObsHashPolicy, assert_same  # noqa: E402

# Small and quick: 21x16 frames, 2 stacked. Breakout with episodic_life ends an episode (one
# life, random play) after 17 to 25 steps, depending on the no-op start; the 76-frame limit
# (19 steps of 4 frames) truncates the longer ones first: both kinds of end within 40 rows.
FRAME_LIMIT = 76
SRC = AleVectorSource("breakout", episodic_life=True, max_num_frames_per_episode=FRAME_LIMIT, img_height=21,
                      img_width=16, stack_num=2)
T, N, SEED = 40, 4, 3
KEYS = ("obs", "starts", "rewards", "terminated", "truncated")


def make_arrays(T: int = T, N: int = N, action_seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(action_seed)
    return {
        "obs": np.zeros((T + 1, N, *SRC.observation_space.shape), np.uint8),
        "starts": np.zeros((T + 1, N), bool),
        "actions": rng.integers(0, SRC.action_space.n, (T, N)),
        "rewards": np.full((T, N), np.nan),
        "terminated": np.zeros((T, N), bool),
        "truncated": np.zeros((T, N), bool),
    }


def head(arrays: dict, rows: int) -> dict:
    """The first ``rows`` rows of a run's arrays (and the observation after them)."""
    return {k: v[:rows + 1] if k in ("obs", "starts") else v[:rows] for k, v in arrays.items()}


def run_all(runner, arrays, close: bool = True):
    """Step every env of ``runner`` together, row after row; returns the finals."""
    try:
        runner.bind(arrays)
        runner.reset_all()
        for t in range(arrays["actions"].shape[0]):
            runner.step([t] * len(runner.env_ids), runner.env_ids)
        return runner.take_finals()
    finally:
        if close:
            runner.close()


def assert_same_arrays(x: dict, y: dict, cols=slice(None)) -> None:
    for k in KEYS:
        np.testing.assert_array_equal(x[k][:, cols], y[k][:, cols], err_msg=k)


def assert_same_finals(f: dict, g: dict) -> None:
    """Same final observations and infos; a one-env view's info has no ``env_id`` (it does
    not know its index), the runner's is the env's index."""
    assert f.keys() == g.keys()
    for key in f:
        np.testing.assert_array_equal(f[key][0], g[key][0])
        fi, gi = dict(f[key][1]), dict(g[key][1])
        for info in (fi, gi):
            assert info.pop("env_id", key[1]) == key[1]
        assert fi == gi, key


@pytest.fixture(scope="module")
def reference():
    """The whole-vector-env runner's data (seed 3, 4 envs, 40 rows), made once."""
    arrays = make_arrays()
    finals = run_all(AleVectorRunner(range(N), SRC, SEED), arrays)
    return arrays, finals


# ---------------------------------------------------------------------------- (a) references
def test_matches_a_hand_driven_atari_vector_env(reference):
    """Each env alone in a one-env AtariVectorEnv through its public API, seeded as the runner
    seeds it, with ALE's own next-step auto-reset turned into SB3's by hand: the runner's
    partial reset after an end is exactly ALE's auto-reset."""
    from ale_py.vector_env import AtariVectorEnv

    got, finals = reference
    acts = got["actions"]
    ref = make_arrays()
    ref_finals = {}
    for i in range(N):
        env = AtariVectorEnv("breakout", 1, num_threads=1, episodic_life=True, max_num_frames_per_episode=FRAME_LIMIT,
                             img_height=21, img_width=16, stack_num=2)
        try:
            o, _ = env.reset(seed=np.array([ale_seed(SEED + i)]))
            ref["obs"][0, i], ref["starts"][0, i] = o[0], True
            for t in range(T):
                o, r, te, tr, info = env.step(np.array([acts[t, i]]))
                ref["rewards"][t, i], ref["terminated"][t, i], ref["truncated"][t, i] = r[0], te[0], tr[0]
                if te[0] or tr[0]:
                    ref_finals[(t, i)] = (o[0].copy(), {"env_id": i, **{k: int(info[k][0]) for k in
                                                                        ("lives", "frame_number",
                                                                         "episode_frame_number")}})
                    o = env.step(np.array([0]))[0]  # ALE's next-step reset: the action is ignored
                    ref["starts"][t + 1, i] = True
                ref["obs"][t + 1, i] = o[0]
        finally:
            env.close()
    assert_same_arrays(got, ref)
    assert got["terminated"].any() and got["truncated"].any(), "the run must cross both kinds of episode end"
    assert finals.keys() == ref_finals.keys()
    for key, (o, info) in ref_finals.items():
        np.testing.assert_array_equal(finals[key][0], o)
        assert finals[key][1] == info


def test_matches_env_runner_over_one_env_views(reference):
    """EnvRunner with one AleVectorEnv per env (the source's one-env view, seeded by
    reset(seed=...), reset() after an end) gives the runner's data."""
    want, want_finals = reference
    ref = make_arrays()
    ref_finals = run_all(EnvRunner(range(N), [SRC] * N, SEED), ref)
    assert_same_arrays(want, ref)
    assert_same_finals(want_finals, ref_finals)


# ---------------------------------------------------------------------------- (b) subsets
@pytest.mark.parametrize("whole_rows", [0, 25], ids=["split-at-start", "split-mid-run"])
def test_subsets_in_any_order_give_the_same_data(reference, whole_rows):
    """Steps naming some envs, in any order, envs drifting apart to their own rows: the
    vector env is split into one per env, at the start (nothing to replay) or after 25
    whole rows (the actions since the seeds, across episode ends, are replayed into the new
    ones)."""
    want, want_finals = reference
    rng = np.random.default_rng(whole_rows)
    arrays = make_arrays()
    runner = AleVectorRunner(range(N), SRC, SEED)
    try:
        runner.bind(arrays)
        runner.reset_all()
        for t in range(whole_rows):
            runner.step([t] * N, list(range(N))[::-1])  # whole rows, in any order
        assert runner.whole
        t_of = np.full(N, whole_rows)
        while (t_of < T).any():
            live = np.flatnonzero(t_of < T)
            pick = rng.permutation(live)[: rng.integers(1, min(len(live), N - 1) + 1)]
            runner.step(t_of[pick].tolist(), pick.tolist())
            t_of[pick] += 1
        assert not runner.whole and len(runner.groups) == N
        finals = runner.take_finals()
    finally:
        runner.close()
    assert_same_arrays(arrays, want)
    assert_same_finals(finals, want_finals)


def test_a_replay_that_diverges_is_refused():
    """The split checks the replayed envs against the vector env's observations: replaying
    other actions than the ones stepped raises, and the runner keeps its vector env."""
    arrays = make_arrays()
    runner = AleVectorRunner(range(N), SRC, SEED)
    try:
        runner.bind(arrays)
        runner.reset_all()
        for t in range(8):
            runner.step([t] * N, list(range(N)))
        g = runner.groups[0]
        g.history[:8] = np.where(arrays["actions"][:8] == 3, 2, 3)  # RIGHT where it went LEFT, else LEFT
        with pytest.raises(RuntimeError, match="not deterministic"):
            runner.step([8], [0])
        assert runner.whole and runner.groups == [g]
    finally:
        runner.close()


def test_layout_independence_non_contiguous_ids(reference):
    """A runner holding envs [3, 1] gives those envs' columns of a runner holding all 4."""
    want, want_finals = reference
    ids = [3, 1]
    arrays = make_arrays()
    finals = run_all(AleVectorRunner(ids, SRC, SEED), arrays)
    assert_same_arrays(arrays, want, cols=ids)
    assert_same_finals(finals, {k: v for k, v in want_finals.items() if k[1] in ids})


# ---------------------------------------------------------------------------- (c) auto-reset
def test_sb3_auto_reset(reference):
    a, finals = reference
    assert a["starts"][0].all()
    ends = a["terminated"] | a["truncated"]
    np.testing.assert_array_equal(a["starts"][1:], ends)
    assert set(finals) == {(int(t), int(i)) for t, i in zip(*np.nonzero(ends))}
    assert not (a["terminated"] & a["truncated"]).any()
    last_start = np.zeros(N, dtype=int)
    for (t, i), (final_obs, info) in sorted(finals.items()):
        length = t + 1 - last_start[i]
        last_start[i] = t + 1
        assert set(info) == {"env_id", "lives", "frame_number", "episode_frame_number"} and info["env_id"] == i
        if a["truncated"][t, i]:  # the frame limit, in frames: 4 a step
            assert length == FRAME_LIMIT // 4
        else:  # episodic_life: a lost life ends the episode (5 lives at the start)
            assert info["lives"] == 4 and length < FRAME_LIMIT // 4
        assert not np.array_equal(final_obs, a["obs"][t + 1, i]), "obs[t+1] must be the reset observation"
        # the reset observation's frame stack is zero but for its newest frame (ALE's reset clears it)
        assert not a["obs"][t + 1, i][0].any() and a["obs"][t + 1, i][-1].any()


def test_take_finals_hands_over_once_and_reset_all_reseeds(reference):
    want, _ = reference
    runner = AleVectorRunner(range(N), SRC, SEED)
    try:
        arrays = make_arrays(T=25)
        finals = run_all(runner, arrays, close=False)
        assert finals and runner.take_finals() == {}
        again = make_arrays(T=25)
        run_all(runner, again, close=False)  # a second reset_all starts again from the seeds
        assert_same_arrays(again, arrays)
        assert_same_arrays(arrays, head(want, 25))
        with pytest.raises(KeyError):
            runner.step([0], [N])
        with pytest.raises(ValueError, match="twice"):
            runner.step([0, 0], [1, 1])
        bad = make_arrays(T=2)
        bad["actions"][0, 2] = SRC.action_space.n  # out of range: refused before C++ sees it (it would hang)
        runner.bind(bad)
        runner.reset_all()
        with pytest.raises(ValueError, match="outside Discrete"):
            runner.step([0] * N, list(range(N)))
        assert runner.whole
        runner.step([1] * N, list(range(N)))  # nothing was sent: the runner goes on
    finally:
        runner.close()
    runner.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        runner.reset_all()


# ---------------------------------------------------------------------------- (d) seeding
def test_seeding(reference):
    a, _ = reference
    # generation 0 is seed + i: env i of seed 3 is env i - 1 of seed 4 (the no-op starts differ per seed)
    c = make_arrays(T=0)
    run_all(AleVectorRunner([0, 1], SRC, SEED + 1), c)
    assert not np.array_equal(a["obs"][0, :2], c["obs"][0, :2])
    np.testing.assert_array_equal(a["obs"][0, 1:3], c["obs"][0, :2])
    # the seeds are exactly what EnvRunner would pass to reset(seed=...), as ALE's C++ int
    r = AleVectorRunner([3, 1], SRC, 7, generation=2, id_offset=10)
    try:
        assert r._seeds == [ale_seed(env_seed(7, 10 + i, 2)) for i in (3, 1)]
    finally:
        r.close()
    assert ale_seed(5) == 5 and ale_seed(2**31) == 0 and ale_seed(2**32 - 1) == 2**31 - 1 and ale_seed(-1) == 2**31 - 1


def test_later_generations_are_fresh_and_match_env_runner():
    g1 = make_arrays(T=20)
    f1 = run_all(AleVectorRunner(range(2), SRC, SEED, generation=1, id_offset=2), g1)
    ref = make_arrays(T=20)
    ref_finals = run_all(EnvRunner(range(2), [SRC] * 2, SEED, generation=1, id_offset=2), ref)
    assert_same_arrays(g1, ref)
    assert_same_finals(f1, ref_finals)
    g0 = make_arrays(T=0)
    run_all(AleVectorRunner(range(2), SRC, SEED, id_offset=2), g0)
    assert not np.array_equal(g0["obs"][0], g1["obs"][0])


# ---------------------------------------------------------------------------- every layout
@pytest.fixture(scope="module")
def serial_rollouts():
    return _collect("serial", Config.serial(N))


def _collect(backend: str, config: Config):
    with make_executor(SRC, ObsHashPolicy(SRC.action_space), num_envs=N, config=config, backend=backend,
                       seed=5) as ex:
        return [ex.collect(s) for s in (30, 20)]


@pytest.mark.parametrize("backend,config", [
    ("shm", Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2)),
    ("serial", Config(num_actors=2, envs_per_actor=2)),
    ("shm", Config(num_actors=2, envs_per_actor=2)),
    ("shm", Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1)),
], ids=["shm-degree2", "serial-2actors", "shm-2actors", "shm-degree2-2policies-batch1"])
def test_every_layout_gives_the_serial_data(serial_rollouts, backend, config):
    """The source runs its runner in each env host; every layout collects the serial loop's
    data, across two collects whose episodes end and go on."""
    ends = sum(int(r.terminated.sum() + r.truncated.sum()) for r in serial_rollouts)
    assert ends > 0 and sum(len(r.final_observations) for r in serial_rollouts) == ends
    assert_same(_collect(backend, config), serial_rollouts)


# ---------------------------------------------------------------------------- source
def test_source_names_spaces_and_checks():
    assert [ale_game(n) for n in ("pong", "Pong-v5", "ALE/Pong-v5", "ale:Pong", "MsPacman-v5")] == \
        ["pong", "pong", "pong", "pong", "ms_pacman"]
    with pytest.raises(ValueError, match="v5 name"):
        ale_game("PongNoFrameskip-v4")
    with pytest.raises(ValueError, match="Similar ROM ids: \\['pong'\\]"):
        ale_game("pongg")
    src = AleVectorSource("ale:Pong-v5", stack_num=2)
    assert src == AleVectorSource("pong", stack_num=2) and src.game == "pong"
    assert src.observation_space.shape == (2, 84, 84) and src.action_space.n == 6
    assert AleVectorSource("pong", grayscale=False).observation_space.shape == (4, 84, 84, 3)
    assert AleVectorSource("pong", full_action_space=True).action_space.n == 18
    back = pickle.loads(pickle.dumps(src))
    assert back == src and back.observation_space == src.observation_space and len(pickle.dumps(src)) < 300
    with pytest.raises(ValueError, match="num_envs"):
        AleVectorSource("pong", num_envs=4)
    with pytest.raises(TypeError, match="frame_skip"):
        AleVectorSource("pong", frame_skip=4)  # AtariVectorEnv's is frameskip
    with pytest.raises(ValueError, match="life_loss_info"):
        AleVectorSource("pong", life_loss_info=True)
    from auturi.tuner.cache import describe_callable

    assert describe_callable(src) == "auturi.envs.ale_vector.AleVectorSource('pong', stack_num=2)"
    # the "ale:" id, as make_executor and the CLI take it
    fns = resolve_env_fns("ale:Pong-v5", 3)
    assert fns == [AleVectorSource("pong")] * 3
    from auturi.cli.policies import resolve_env_spec

    assert resolve_env_spec("ale:pong") == "ale:pong"
    # EnvRunner's env_fns work as the runner's source too, when they all name one game
    with pytest.raises(TypeError):
        AleVectorRunner([0], [lambda: None], 0)


def test_one_env_view():
    view = SRC()
    assert isinstance(view, AleVectorEnv)
    try:
        with pytest.raises(RuntimeError, match="before reset"):
            view.step(0)
        obs, info = view.reset(seed=3)
        assert SRC.observation_space.contains(obs) and info["lives"] == 5
        ends = 0
        for _ in range(30):
            obs, r, te, tr, info = view.step(np.int64(1))
            assert SRC.observation_space.contains(obs) and isinstance(r, float)
            if te or tr:
                ends += 1
                with pytest.raises(RuntimeError, match="episode ended"):
                    view.step(0)
                view.reset()
        assert ends >= 1
        with pytest.raises(ValueError, match="outside Discrete"):
            view.step(4)
    finally:
        view.close()
    view.close()


def test_a_missing_vector_env_names_the_fix(monkeypatch):
    import ale_py

    import auturi.envs.ale_vector as m

    monkeypatch.delattr(ale_py, "vector_env")
    monkeypatch.setitem(sys.modules, "ale_py.vector_env", None)
    assert not m.ale_vector_available()
    with pytest.raises(ImportError, match='pip install "ale-py>=0.11"'):
        AleVectorSource("pong")


def test_does_not_import_torch():
    code = ("import sys, numpy as np\n"
            "from auturi.envs import resolve_env_fns\n"
            "src = resolve_env_fns('ale:pong', 1)[0]\n"
            "r = src.make_runner([0], 1)\n"
            "a = {'obs': np.zeros((2, 1, 4, 84, 84), np.uint8), 'starts': np.zeros((2, 1), bool),\n"
            "     'actions': np.zeros((1, 1), np.int64), 'rewards': np.zeros((1, 1)),\n"
            "     'terminated': np.zeros((1, 1), bool), 'truncated': np.zeros((1, 1), bool)}\n"
            "r.bind(a); r.reset_all(); r.step([0], [0]); r.close()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
