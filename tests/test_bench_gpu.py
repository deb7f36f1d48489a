"""``python -m bench.gpu`` (issues 32 and 33, section 4): its arguments, its time budget, its
ratios and its summary on synthetic records, and the envs-only ceiling's processes. The whole
``--smoke`` run takes ~55 s on a loaded 2-core machine (2026-11-26), over this file's share of
CI, so it is not run here: run it by hand (``PYTHONPATH=src python -m bench.gpu --smoke --out
/tmp/gpu_smoke``). Its part 3 alone (ale-py's ``AtariVectorEnv``, tiny, on cpu) takes a few
seconds and is run here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_runs_and_out_is_required():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT])}
    done = subprocess.run([sys.executable, "-m", "bench.gpu", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--out" in done.stdout and "--smoke" in done.stdout
    with pytest.raises(SystemExit):
        gpu.parse_args([])  # --out is required


def test_defaults_are_the_gpu_recipe_and_smoke_is_tiny_on_cpu():
    full = gpu.settings(gpu.parse_args(["--out", "x"]))
    assert (full["device"], full["n_envs"], full["n_steps"], full["batch_size"], full["n_epochs"]) == \
        ("cuda", 32, 128, 256, 4)
    assert full["steps"] == [32_768, 98_304] and full["collect_envs"] == 64 and full["tune_devices"] == ["cpu", "cuda"]
    assert str(gpu._config(full["fixed"])) == str(gpu._config("2,16,8,1,cuda,16"))
    smoke = gpu.settings(gpu.parse_args(["--out", "x", "--smoke", "--steps", "64"]))
    assert smoke["device"] == "cpu" and "cuda" not in smoke["tune_devices"] and smoke["steps"] == [64]
    assert gpu._config(smoke["fixed"]).policy_device == "cpu" and gpu._config(smoke["overlap"]).policy_device == "cpu"
    # part 3: Pong in AtariVectorEnv, 64 envs x 64 steps on cuda; the smoke run tiny, on cpu, no tune
    assert (full["ale_game"], full["ale_envs"], full["ale_steps"], full["ale_device"]) == ("pong", 64, 64, "cuda")
    assert full["ale_layouts"] == list(gpu.ALE_LAYOUTS) and full["ale_tune_seconds"] > 0
    assert 1 <= full["ale_threads"] <= 64
    assert (smoke["ale_envs"], smoke["ale_device"], smoke["ale_tune_seconds"]) == (4, "cpu", 0)
    assert all(gpu._config(t).policy_device == "cpu" and gpu._config(t).num_envs == 4 for t in smoke["ale_layouts"])
    assert gpu.settings(gpu.parse_args(["--out", "x", "--ale-tune-seconds", "5"]))["ale_tune_seconds"] == 5
    assert gpu.parse_args(["--out", "x"]).parts == [1, 2, 3]


def test_the_several_actor_default_spreads_its_lanes_over_the_gpu_box_cores():
    from auturi.executor.layout import plan_layout
    plan = plan_layout(gpu._config(gpu.SPREAD), cores=range(16))
    assert len(plan.actors) > 1 and {q.cpus for q in plan.processes if q.kind in ("actor", "env")} == {
        (c,) for c in range(16)}


def test_the_overlapped_default_is_an_overlapped_plan():
    from auturi.executor.layout import plan_layout

    assert all(a.overlap for a in plan_layout(gpu._config(gpu.OVERLAP)).actors)


def test_the_ale_layouts_are_lockstep_so_each_runner_keeps_one_vector_env():
    from auturi.executor.layout import plan_layout

    for text in gpu.ALE_LAYOUTS + tuple(gpu.SMOKE_ALE_LAYOUTS):
        plan = plan_layout(gpu._config(text))
        assert all(a.lockstep and len(a.env_shares) == 1 for a in plan.actors), text
    assert {gpu._config(t).num_envs for t in gpu.ALE_LAYOUTS} == {64}
    assert gpu._layout_key(gpu._config("2,32,1,1,cuda,32")) == "auturi_ale_2x32_d1"


def test_the_lockstep_space_keeps_only_lockstep_layouts_and_says_why_of_the_rest():
    from auturi import Config, build_space
    from auturi.executor.layout import plan_layout

    full = build_space(8, cores=2, devices=["cpu"])
    space = gpu.lockstep_space(8, ["cpu"], cores=2)
    assert 0 < len(space) < len(full) and Config.serial(8) in space
    assert all(all(a.lockstep for a in plan_layout(c).actors) for c in space.configs)
    dropped = [c for c, why in space.pruned if why.startswith("not lockstep")]
    assert len(dropped) == len(full) - len(space) and not any(c in space for c in dropped)


def _run(kind: str, steps: int, learn: float, **kw) -> dict:
    return {"system": kind, "steps": steps, "build_seconds": 2.0, "learn_seconds": learn, **kw}


def test_ratios_are_against_plain_sb3_at_the_same_steps():
    runs = [_run("sb3_subproc", 100, 10.0), _run("wrap_dummy", 100, 20.0, wrap_seconds=5.0),
            _run("sb3_subproc", 300, 30.0), _run("fixed", 300, 25.0)]
    gpu._ratios(runs)
    assert runs[1]["vs_sb3_subproc"] == pytest.approx(0.5) and runs[1]["vs_sb3_subproc_with_wrap"] == pytest.approx(0.4)
    assert runs[3]["vs_sb3_subproc"] == pytest.approx(1.2)
    # the whole script: plain SB3 builds (2 s) and learns (10 s); the wrap's builds, wraps, learns
    assert runs[1]["vs_sb3_subproc_script"] == pytest.approx(12.0 / 27.0)


def test_estimates_scale_the_shorter_run_and_know_nothing_before_it():
    runs = [_run("sb3_subproc", 100, 10.0), _run("wrap_dummy", 100, 20.0, wrap_seconds=1.0),
            _run("fixed", 100, 8.0)]
    assert gpu._estimate("fixed", 300, []) == 0.0
    assert gpu._estimate("sb3_subproc", 300, runs) == pytest.approx(2 + 10 + 20)
    # the online run: its shorter run (search paid) + the extra steps at the fixed layout's rate, 20% slack
    assert gpu._estimate("wrap_dummy", 300, runs) == pytest.approx(2 + 1 + 20 + 1.2 * 8 * 2)


def test_the_clock_refuses_what_would_overrun():
    c = gpu.Clock(100.0)
    assert c.allows(10.0) and not c.allows(1000.0) and c.left() <= 100.0


def _records() -> tuple[dict, dict, dict]:
    cfg = "actors=1 x envs=32 | env_degree=16 | policies=1@cuda batch=32"
    runs = [_run("sb3_subproc", 32_768, 12.0, layout="SubprocVecEnv x 32"),
            _run("wrap_dummy", 32_768, 15.0, wrap_seconds=1.0, layout=cfg, vs_sb3_subproc=0.8,
                 vs_sb3_subproc_with_wrap=0.75, vs_sb3_subproc_script=0.9,
                 wrap_phases={"envs": 0.5, "executor": 2.0, "tuner": 3.0, "moves": 2.5, "total": 5.5},
                 tuner={"locked": cfg, "locked_at_collect": 3, "first_run": {"reconfigures": 1,
                                                                           "reconfigure_seconds": 2.5,
                                                                           "seconds_off_choice": 4.0}},
                 rollouts=[{"rollout": 0, "config": "serial", "seconds": 1.5, "phase": "explore",
                            "moves": [{"to": cfg, "seconds": 2.5}]},
                           {"rollout": 1, "config": cfg, "seconds": 0.5, "phase": "locked", "moves": []}]),
            {"system": "wrap_subproc", "steps": 32_768, "refused": "EnvRebuildError: cannot rebuild"},
            {"system": "fixed", "steps": 32_768, "error": "RuntimeError: boom", "traceback": "..."}]
    p1 = {"settings": {"device": "cuda", "atari": True, "n_envs": 32, "n_steps": 128, "batch_size": 256,
                       "n_epochs": 4, "steps": [32_768, 98_304], "fixed": gpu.FIXED}, "runs": runs,
          "skipped": ["sb3_subproc at 98,304 steps (estimated 60 s, 10 s left)"]}
    sps = {"median": 20_000.0}
    p2 = {"settings": {"env": "pong", "device": "cuda", "collect_envs": 64, "collect_steps": 64, "collect_samples": 3,
                       "ceiling_procs": 16, "tune_seconds": 45.0, "tune_devices": ["cpu", "cuda"],
                       "overlap": gpu.OVERLAP, "spread": gpu.SPREAD},
          "systems": {"envs_only": {"steps_per_second": {"median": 29_000.0}, "vs_envs_only": 1.0},
                      "sb3_subproc": {"steps_per_second": {"median": 8_000.0}, "vs_sb3_subproc": 1.0},
                      "auturi_tuned": {"steps_per_second": sps, "config": cfg, "vs_sb3_subproc": 2.5,
                                       "vs_envs_only": 0.69},
                      "auturi_overlap": {"error": "ValueError: no", "config": cfg, "overlap": [True]},
                      "auturi_spread": {"steps_per_second": {"median": 15_000.0}, "config": gpu.SPREAD,
                                        "lane_cores": 16, "vs_sb3_subproc": 1.875, "vs_envs_only": 0.52}},
          "tune": {"choice": cfg, "predicted": 30_000.0, "tuner_measured": 21_000.0, "measured_here": 20_000.0,
                   "predicted_over_measured": 1.5, "limit": {"steps_per_second": 28_000.0}, "limit_share": 0.75},
          "skipped": []}
    machine = {"gpu": "NVIDIA H200", "usable_cores": 16, "cpu": "x", "versions": {"torch": "2.11"},
               "git_commit": "abc", "git_dirty": False}
    return p1, p2, machine


def test_the_summary_shows_every_run_its_ratio_refusals_errors_skips_and_the_moves():
    p1, p2, machine = _records()
    md = gpu.summary(p1, p2, machine, "python -m bench.gpu --out d")
    assert "NVIDIA H200, 16 cores" in md and "commit abc" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| `auturi.wrap(model)`, DummyVecEnv"))
    assert "15.0 (0.80x; 0.75x; script 0.90x)" in row and row.count("|") == 4  # the config's own | are escaped
    assert "refused (EnvRebuildError)" in md and "error: RuntimeError: boom" in md
    assert "| wrap_dummy | 32,768 | 0.5 | 2.0 | 3.0 | 2.5 | 5.5 |" in md  # where the wrap's seconds went
    assert "| plain SB3, SubprocVecEnv | 12.0 | skipped |" in md
    assert "at collect 3" in md and "| 0 | serial | 1.50 |" in md and "(2.50 s)" in md
    assert "| 20,000 | 2.50x | 69% |" in md and "error: ValueError: no" in md
    assert "(lanes on 16 cores) | 15,000 | 1.88x | 52% |" in md
    assert "predicted 30,000 steps/s" in md and "predicted / measured here 1.50" in md
    for line in md.splitlines():  # every table row has its columns, nothing split by a config's |
        if line.startswith("| ") and "rollout" not in line and "---" not in line:
            assert line.count(" | ") >= 2


def test_a_failed_part_still_renders():
    md = gpu.summary({"error": "ImportError: x"}, None, {"versions": {}}, "c")
    assert "Failed: ImportError: x" in md and "Part 2" not in md


def test_the_ceiling_steps_its_envs_in_processes_and_ends_them():
    c = gpu.Ceiling(gpu.make_cartpole, 3, 2)
    try:
        assert c.settings == {"processes": 2, "envs_per_process": [2, 1]}
        assert c.run(5) > 0
    finally:
        c.close()
    assert all(not p.is_alive() for p in c.procs)


def _part3_record() -> dict:
    cfg = "actors=2 x envs=32 | env_degree=1 | policies=1@cuda batch=32"
    return {"settings": {"ale_game": "pong", "ale_envs": 64, "ale_steps": 64, "ale_samples": 3, "ale_device": "cuda",
                         "ale_threads": 16, "ale_layouts": list(gpu.ALE_LAYOUTS), "ale_tune_seconds": 20.0},
            "systems": {"ale_envs_only": {"steps_per_second": {"median": 40_000.0}, "vs_envs_only": 1.0,
                                          "vs_ale_alone": 2.0},
                        "ale_alone": {"steps_per_second": {"median": 20_000.0}, "vs_envs_only": 0.5,
                                      "vs_ale_alone": 1.0},
                        "auturi_ale_2x32_d1": {"steps_per_second": {"median": 30_000.0}, "config": cfg,
                                               "vs_envs_only": 0.75, "vs_ale_alone": 1.5},
                        "auturi_ale_4x16_d1": {"error": "RuntimeError: cuda gone", "config": cfg}},
            "tune": {"choice": cfg, "predicted": 33_000.0, "tuner_measured": 31_000.0, "space": 12,
                     "limit": {"steps_per_second": 40_000.0}, "limit_share": 0.8},
            "skipped": ["auturi_ale_tuned (estimated 15 s, 3 s left)"]}


def test_the_summary_shows_part3_against_the_vector_env_alone_and_its_ceiling():
    p1, p2, machine = _records()
    md = gpu.summary(p1, p2, machine, "c", _part3_record())
    part3 = md[md.index("## Part 3"):]
    row = next(ln for ln in part3.splitlines() if ln.startswith("| Auturi on ale:pong: actors=2"))
    assert "| 30,000 | 1.50x | 75% |" in row and row.count(" | ") == 4  # the config's own | are escaped
    assert row.endswith("| - |")  # no cores-busy figure in this record: shown as missing
    assert "| 20,000 | 1.00x | 50% |" in part3 and "error: RuntimeError: cuda gone" in part3
    assert "12 lockstep layouts" in part3 and "predicted 33,000" in part3 and "share 80%" in part3
    assert "Skipped: auturi_ale_tuned" in part3
    assert gpu.summary(None, None, machine, "c", {"unavailable": "no AtariVectorEnv"}).count("Not run: no Atari") == 1


def test_part3_is_skipped_with_its_reason_where_ale_py_has_no_vector_env(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu, "_ale_unavailable", lambda: "ale-py older than 0.11")
    monkeypatch.setattr(gpu, "AleAlone", None)  # anything built would fail: nothing may be
    s = gpu.settings(gpu.parse_args(["--out", "x", "--smoke"]))
    rec = gpu.part3(s, gpu.Clock(100.0))
    assert rec["unavailable"] == "ale-py older than 0.11" and rec["systems"] == {}
    assert "Not run: ale-py older than 0.11" in gpu.summary(None, None, {"versions": {}}, "c", rec)


def test_the_smoke_run_of_part3_measures_every_system_on_cpu(tmp_path):
    """The smoke run's part 3 as the script writes it: the vector env alone (random actions;
    the CNN on every batch) and Auturi on ``ale:pong`` in both smoke layouts, every rate > 0,
    the ratios against the vector env alone and its ceiling, every process ended."""
    from auturi.envs.ale_vector import ale_vector_available

    if not ale_vector_available():
        pytest.skip("ale-py's AtariVectorEnv is not installed (pip install 'ale-py>=0.11')")
    import json

    import torch

    threads = torch.get_num_threads()
    try:
        gpu.main(["--smoke", "--parts", "3", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # the smoke run sets 1 for its process: this is pytest's
    with open(tmp_path / "part3_ale_vector.json") as f:
        rec = json.load(f)
    assert rec["smoke"] and rec["settings"]["ale_envs"] == 4 and rec["settings"]["ale_device"] == "cpu"
    rows = rec["systems"]
    keys = ["ale_envs_only", "ale_alone"] + [gpu._layout_key(gpu._config(t)) for t in gpu.SMOKE_ALE_LAYOUTS]
    assert list(rows) == keys, rows
    for k in keys:
        assert "error" not in rows[k], rows[k].get("traceback")
        assert rows[k]["steps_per_second"]["median"] > 0 and rows[k]["vs_envs_only"] > 0, k
        assert rows[k]["vs_ale_alone"] > 0, k
    assert rows["ale_alone"]["vs_ale_alone"] == pytest.approx(1.0)
    assert rows["ale_envs_only"]["settings"]["num_threads"] == rec["settings"]["ale_threads"]
    assert rec["skipped"] == ["auturi.tune (no tune asked: --ale-tune-seconds 0)"]
    md = (tmp_path / "summary.md").read_text()
    assert "## Part 3" in md and "Part 1" not in md and "Part 2" not in md


def test_the_tune_record_keeps_the_whole_report_for_an_offline_model_check():
    """The H200 run kept only the tuner's choice and trials; the profile the model predicted
    from (and its fit) is what checking the model against that box needs."""
    import gymnasium as gym

    import auturi
    from auturi.envs import CountingEnv

    rep = auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=2, num_steps=4,
                      budget_trials=2, backend="serial", cache=False)
    rec = gpu._tune_record(rep)
    assert rec["choice"] == str(rep.choice) and rec["trials"]
    assert rec["record"]["strategy"]["profile"]["env_step_seconds"] > 0  # what the model predicted from
    json.dumps(rec, default=str)  # it goes into part 2's JSON


def test_a_systems_row_shows_the_cores_the_machine_kept_busy_while_it_ran():
    r = {"steps_per_second": {"median": 1000.0}, "vs_sb3_subproc": 1.5, "vs_envs_only": 0.5, "busy_cores": 12.34}
    assert gpu._system_row("x", r, "vs_sb3_subproc") == "| x | 1,000 | 1.50x | 50% | 12.3 |"

    class Spin:  # a "collect" that keeps this process's core busy for a moment
        def run(self, steps):
            import time
            end = time.process_time() + 0.2
            while time.process_time() < end:
                pass
            return float(steps)

    rates, busy = gpu._sample(Spin(), {"collect_steps": 4, "collect_samples": 3})
    assert rates["median"] == 4.0
    if gpu._busy_jiffies() is not None:  # Linux: /proc/stat
        import os
        assert 0.5 <= busy <= (os.cpu_count() or 1) + 0.01  # at least the core it spun
