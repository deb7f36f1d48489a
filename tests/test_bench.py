"""The benchmark runner's smoke test: the real entry point (``python -m bench``) at its
smallest sizing, into a temporary directory, checking only the shape of what it writes
(never a timing)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("stable_baselines3")
pytest.importorskip("matplotlib")
PIL = pytest.importorskip("PIL.Image")

EXPECTED_PEERS = ("auturi_tuned", "auturi_fixed", "dummy", "subproc", "async", "envpool", "envpool_async", "rllib_0",
                  "torchrl_multisync")


def docs_state() -> tuple[dict[str, int], str]:
    """What a bench run could change in docs/: each image's modification time, and the block
    of docs/benchmarks.md the bench rewrites (the text between its markers)."""
    from bench.report import BEGIN, END

    images = {p.name: p.stat().st_mtime_ns for p in (REPO / "docs/img").glob("*")} if (REPO / "docs/img").is_dir() \
        else {}
    page = (REPO / "docs/benchmarks.md").read_text(encoding="utf-8")
    return images, page[page.find(BEGIN):page.find(END)]


SMOKE_SECONDS = 300
"""The smoke run's limit, counted from its start: it starts with the session and goes on beside
the modules before this one (their tests slow it), ~20 s of one core alone (2026-11-27)."""


class SmokeRun:
    """The smoke run (conftest's BackgroundRun) and what docs/ looked like before it started."""

    def __init__(self, tmp_path_factory):
        from tests.conftest import BackgroundRun

        self.out = tmp_path_factory.mktemp("bench")
        self.before = docs_state()
        self.run = BackgroundRun([sys.executable, "-m", "bench", "--smoke", "--workloads", "cartpole", "--out",
                                  str(self.out)], self.out, SMOKE_SECONDS, cwd=REPO)
        self._changed: bool | None = None

    def result(self) -> tuple[subprocess.CompletedProcess, Path, bool]:
        """``(the run's CompletedProcess, the folder, whether docs/ changed while it ran)``."""
        proc = self.run.result()
        if self._changed is None:
            self._changed = self.before != docs_state()
        return proc, self.out, self._changed

    def end(self) -> None:
        self.run.end()


def early_run(items, tmp_path_factory) -> SmokeRun | None:
    """Called by conftest's ``_start_early_runs`` as the session starts: the default run (no
    --update-docs) at the smoke sizing, into a temporary folder, when the smoke test is among
    ``items``. It then runs beside the modules before this one (test_adapters_common and
    test_ale_vector in a full run: in-process, mostly one core) instead of making the smoke test
    wait ~20 s for it."""
    if any(getattr(item, "module", None) is sys.modules[__name__] and item.originalname == SMOKE_TEST
           for item in items):
        return SmokeRun(tmp_path_factory)
    return None


@pytest.fixture(scope="module")
def smoke() -> tuple[subprocess.CompletedProcess, Path, bool]:
    """The smoke run's result, waited for (started with the session: ``early_run``)."""
    from tests.conftest import EARLY_RUNS

    return EARLY_RUNS[__name__].result()


SMOKE_TEST = "test_smoke_run_writes_json_markdown_and_plots"


@pytest.mark.timeout(180)
def test_smoke_run_writes_json_markdown_and_plots(smoke):
    proc, out, docs_changed = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "collect cartpole: round 1/" in proc.stdout  # progress on stdout
    res = json.loads((out / "bench_smoke.json").read_text())
    for key in ("name", "mode", "machine", "command", "sizing", "seconds", "collect", "e2e", "envstep"):
        assert key in res, key
    assert res["command"].startswith("python -m bench --smoke")

    (row,) = res["collect"]["workloads"]
    assert row["workload"] == "cartpole"
    rounds = res["sizing"]["rounds"]
    for peer in EXPECTED_PEERS:  # each one ran, or says why not
        assert peer in row["peers"] or row["skipped"].get(peer), peer
    for must in ("auturi_tuned", "dummy", "subproc", "async"):
        assert must in row["peers"], must
    if importlib.util.find_spec("envpool"):
        assert "envpool" in row["peers"]
    if importlib.util.find_spec("ray"):
        assert "rllib_0" in row["peers"]
    if importlib.util.find_spec("torchrl"):
        assert "torchrl_multisync" in row["peers"], row["skipped"].get("torchrl_multisync")
    assert "_limit" not in row["peers"]  # the limit probe is measured in the rounds, not a peer
    lim = row["limit"]
    assert lim["bound"] in ("env", "inference") and lim["steps_per_second"] > 0 and lim["cores"] >= 1
    assert row["limit_share"] == pytest.approx(row["peers"]["auturi_tuned"]["median"] / lim["steps_per_second"])
    for name, s in row["peers"].items():
        assert len(s["samples"]) == rounds and all(x > 0 for x in s["samples"]), name
        assert s["min"] <= s["median"] <= s["max"]
        if name != "auturi_tuned":
            assert row["auturi_vs"][name] > 0
    assert {r["n"] for r in res["envstep"]["rows"]} == set(res["sizing"]["envstep_ns"])
    (case,) = res["e2e"]["cases"]
    assert case["sb3"]["median"] > 0 and case["fixed"]["speedup_vs_sb3"] > 0

    md = (out / "bench_smoke.md").read_text()
    assert md.startswith("## Auturi against its peers")
    assert "Machine: " in md and "Command: `python -m bench --smoke" in md
    for name in row["peers"]:
        assert f"\n| {name} | " in md, name
    for n in res["sizing"]["envstep_ns"]:
        assert f"\n| {n} | " in md
    assert "How close to the limit" in md and f"| {100 * row['limit_share']:.0f}% |" in md
    for sec in ("collect", "e2e", "envstep"):
        png = out / f"bench_smoke_{sec}.png"
        assert f"]({png.name})" in md
        with PIL.open(png) as im:
            assert im.format == "PNG" and im.size[0] > 0 and im.size[1] > 0
    assert not docs_changed, "a run without --update-docs must leave docs/ alone"
    assert "docs/ left as it was (--update-docs splices these tables into docs/benchmarks.md)" in proc.stdout


def test_default_run_writes_to_a_results_folder_of_its_own():
    """``python -m bench --quick`` as the README shows it: a new folder under
    bench/results/runs/, docs/ untouched; only --update-docs writes the tracked records and docs."""
    from bench.suite import REPO as BENCH_REPO
    from bench.suite import outputs, parse_args

    for argv in (["--quick"], [], ["--smoke", "--no-docs"]):
        out, page = outputs(parse_args(argv), stamp="2026-11-26-120000")
        assert page is None and out == BENCH_REPO / "bench/results/runs/2026-11-26-120000", argv
    assert outputs(parse_args(["--quick", "--out", "/tmp/x"]))[0] == Path("/tmp/x")
    out, page = outputs(parse_args(["--quick", "--update-docs"]))
    assert (out, page) == (BENCH_REPO / "bench/results", BENCH_REPO / "docs/benchmarks.md")
    first, _ = outputs(parse_args([]))
    assert first.parent == BENCH_REPO / "bench/results/runs" and not first.exists()  # named, made only on write
    with pytest.raises(SystemExit):
        parse_args(["--update-docs", "--no-docs"])


def test_splice_keeps_everything_outside_the_markers():
    from bench.report import BEGIN, END, splice

    before, after = "# Page\r\n\r\nintro é\n\n", "\n## Hand-written\r\ntext ✓\n"
    page = before + BEGIN + "\nold block\n" + END + after
    new = splice(page, "new block")
    assert new == before + BEGIN + "\nnew block\n" + END + after
    assert splice(new, "new block") == new
    with pytest.raises(ValueError, match="markers"):
        splice("no markers here", "x")


def test_auturi_bench_forwards_to_the_runner():
    proc = subprocess.run([sys.executable, "-m", "auturi.cli", "bench", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout and "--update-docs" in proc.stdout and "--no-docs" in proc.stdout


def test_limit_table_and_target_rows():
    from bench.report import limit_lines, limit_table, targets_md

    def row(name, share, bound):
        return {"workload": name, "limit_share": share, "peers": {"auturi_tuned": {"median": 1000.0 * share}},
                "limit": {"steps_per_second": 1000.0, "env_steps_per_second": 1000.0 if bound == "env" else 4000.0,
                          "inference_steps_per_second": 4000.0 if bound == "env" else 1000.0, "cores": 2,
                          "bound": bound}}

    rows = [row("a", 0.5, "env"), row("b", 0.9, "env"), row("c", 0.3, "inference")]
    rows[1]["limit"]["cpu_steps_per_second"] = 1000.0  # a record with the shared-cores term
    table = "\n".join(limit_table(rows))
    assert "| a | 1,000 | env | - | 1,000 | 4,000 | 500 | 50% |" in table
    assert "| b | 1,000 | env | 1,000 | 1,000 | 4,000 | 900 | 90% |" in table
    assert limit_lines(rows[1]) == ["Limit: 1,000 steps/s (env-bound: envs and inference sharing 2 cores); Auturi "
                                    "tuned reaches **90%** of it."]
    assert "| c | 1,000 | inference |" in table
    assert limit_lines(rows[0]) == ["Limit: 1,000 steps/s (env-bound: 2 cores x 500 steps/s); Auturi tuned reaches "
                                    "**50%** of it."]
    targets = "\n".join(targets_md({"collect": {"workloads": rows}}))
    assert "(env-bound), a | 50% | **not met** |" in targets and "(env-bound), b | 90% | met |" in targets
    assert "(env-bound), c" not in targets  # the 80% target is for env-bound workloads only
    assert limit_table([{"workload": "x", "peers": {}}]) == []  # no limit measured: no table


def test_football_network_takes_channels_last_frames():
    torch = pytest.importorskip("torch")
    from bench.workloads import WORKLOADS, smm_cnn

    net = smm_cnn(72, 96, 4, 19)
    logits, value = net(torch.zeros(3, 72, 96, 4, dtype=torch.uint8))
    assert logits.shape == (3, 19) and value.shape == (3, 1)
    assert WORKLOADS["football"].envpool_task == "gfootball/academy_3_vs_1_with_keeper-v1"


torchrl_only = pytest.mark.skipif(importlib.util.find_spec("torchrl") is None,
                                  reason="torchrl is not installed (see bench/torchrl_peer.py for the install line)")


@torchrl_only
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_torchrl_actor_runs_the_workload_network_in_process(env_id):
    """The TorchRL actor around a workload's network, in TorchRL's own collector over a
    nested batch (2 x 2 envs, no processes): valid actions for every env, and the network's
    output for a nested batch is its output for the flattened one."""
    import functools

    import gymnasium as gym
    import torch
    from torchrl.collectors import Collector
    from torchrl.envs import SerialEnv

    from bench.torchrl_peer import ActorFactory, SerialEnvFn
    from bench.workloads import mlp_policy

    probe = gym.make(env_id)
    obs_dim, space = probe.observation_space.shape[0], probe.action_space
    probe.close()
    policy = mlp_policy(obs_dim, space)
    actor = ActorFactory(policy.model_fn, space, 1)()
    nested = SerialEnv(2, SerialEnvFn(functools.partial(gym.make, env_id), 2))
    collector = Collector(nested, actor, frames_per_batch=16, total_frames=-1)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    assert batch.numel() == 16
    actions = batch["action"]
    if isinstance(space, gym.spaces.Discrete):
        assert actions.dtype == torch.int64 and ((actions >= 0) & (actions < space.n)).all()
    else:
        assert actions.shape[-1] == space.shape[0]
        assert ((actions >= float(space.low[0])) & (actions <= float(space.high[0]))).all()
    module = actor.module[0].module  # the DistParams around the network
    obs = batch["observation"][:, :, 0]  # (2, 2, obs_dim): a nested batch
    out = module(obs)[0]
    flat = module.net(obs.reshape(4, obs_dim))[0]
    torch.testing.assert_close(out.reshape(4, -1), flat)


@torchrl_only
def test_torchrl_worker_factories_survive_torchrls_pickling_wrapper():
    """TorchRL wraps each worker's env factory in ``CloudpickleWrapper``, which copies the
    factory's ``__dict__`` onto itself: a factory attribute named ``fn`` replaced the
    wrapper's own, and workers built the bare gymnasium env (AttributeError in the worker)."""
    import functools
    import pickle

    import gymnasium as gym
    from torchrl.data.utils import CloudpickleWrapper
    from torchrl.envs import EnvBase

    from bench.torchrl_peer import GymEnvFn, SerialEnvFn

    for factory in (GymEnvFn(functools.partial(gym.make, "CartPole-v1")),
                    SerialEnvFn(functools.partial(gym.make, "CartPole-v1"), 2)):
        env = pickle.loads(pickle.dumps(CloudpickleWrapper(factory)))()
        try:
            assert isinstance(env, EnvBase), type(env)
        finally:
            if not env.is_closed:  # a SerialEnv starts its envs lazily
                env.close()


@pytest.mark.skipif(importlib.util.find_spec("pufferlib") is None, reason="pufferlib-core is not installed")
@pytest.mark.parametrize("kind", ["pufferlib", "pufferlib_async"])
def test_pufferlib_peer_steps_the_workload_and_ends_its_workers(kind):
    import dataclasses
    import multiprocessing as mp

    from bench.peers import make_workload_peer
    from bench.workloads import get_workload

    w = dataclasses.replace(get_workload("halfcheetah" if importlib.util.find_spec("mujoco") else "cartpole"),
                            num_envs=4, num_steps=4)
    before = set(mp.active_children())
    r = make_workload_peer(kind, w, warmup_steps=2)  # Gaussian actions past the bounds are clipped, not refused
    try:
        assert r.batch == (4 if kind == "pufferlib" else 2)
        assert r.run(4) > 0
    finally:
        r.close()
    assert set(mp.active_children()) <= before  # workers joined, not left as zombies


def test_online_e2e_rotates_variants_and_keeps_warm_after_fresh():
    from bench.online_e2e import variant_order

    variants = ["sb3", "fresh", "warm", "fixed"]
    orders = [variant_order(variants, seed) for seed in range(3)]
    assert [o[0] for o in orders] == ["sb3", "fresh", "fixed"]  # each unit leads one seed
    for o in orders:
        assert sorted(o) == sorted(variants) and o.index("warm") == o.index("fresh") + 1


def test_online_e2e_pairs_each_variant_with_the_same_seeds_sb3_run():
    from bench.online_e2e import summarize

    runs = [{"workload": "w", "length": 30, "variant": v, "seed": seed, "seconds": s, "episodes": 1,
             "final_return": None}
            for seed, (sb3, fresh) in enumerate([(10.0, 12.5), (20.0, 20.0)])
            for v, s in (("sb3", sb3), ("fresh", fresh))]
    p = summarize(runs)["w@30s"]["fresh"]["paired_vs_sb3"]
    assert p["seeds"] == 2 and p["min"] == 0.8 and p["max"] == 1.0
    assert abs(p["geomean"] - 0.8 ** 0.5) < 1e-12  # not the ratio of medians (15 / 16.25)


def test_online_e2e_pairs_warm_with_the_same_seeds_fixed_run():
    from bench.online_e2e import summarize, table

    runs = [{"workload": "w", "length": 30, "variant": v, "seed": seed, "seconds": s, "episodes": 1,
             "final_return": None}
            for seed, times in enumerate([(10.0, 9.0, 9.9, 9.0), (20.0, 18.0, 18.0, 18.0)])
            for v, s in zip(("sb3", "fresh", "warm", "fixed"), times)]
    row = summarize(runs)["w@30s"]
    p = row["warm"]["paired_vs_fixed"]
    assert p["seeds"] == 2 and p["max"] == 1.0 and abs(p["min"] - 9.0 / 9.9) < 1e-12
    assert "0.91-1.00" in table({"summary": {"w@30s": row}})  # the table's warm/fixed column is this ratio


def test_offpolicy_summary_pairs_each_kind_with_the_same_repeats_dummy_run():
    from bench.offpolicy import _summary

    runs = [{"algo": "sac", "kind": k, "seed": rep, "seconds": s}
            for rep, times in enumerate([(10.0, 12.5), (20.0, 20.0)]) for k, s in zip(("dummy", "wrap"), times)]
    p = _summary(runs)["sac"]["wrap"]["paired_vs_dummy"]
    assert p["repeats"] == 2 and p["min"] == 0.8 and p["max"] == 1.0
    assert abs(p["geomean"] - 0.8 ** 0.5) < 1e-12  # not the ratio of medians (15 / 16.25)
    assert set(_summary(runs)["sac"]) == {"dummy", "wrap"}  # kinds not run are left out


def test_choice_ab_table_names_each_revisions_choices_and_their_ratio():
    from bench.choice_ab import markdown

    row = {"workload": "slow", "runs": {"ref": [{}, {}], "head": [{}, {}]},
           "labels": {"ref_0": "ref_0", "ref_1": "ref_0", "head_0": "head_0", "head_1": "serial"},
           "configs": {"serial": "S", "ref_0": "A", "head_0": "B"},
           "ref": {"median_of_choices": 5000.0, "tune_seconds": [10.0, 12.0]},
           "head": {"median_of_choices": 9000.0, "tune_seconds": [14.0, 16.0]},
           "head_vs_ref": 1.8, "head_vs_best_peer": 3.0}
    md = markdown({"machine": "m", "command": "python -m bench.choice_ab --ref x", "started": "now", "workloads": [row]})
    assert "| slow | A; A | B; S | 11 / 15 | 5,000 | 9,000 | 1.80x | 3.00x |" in md
