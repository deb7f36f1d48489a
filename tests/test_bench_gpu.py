"""``python -m bench.gpu`` (issues 32 and 33, section 4): its arguments, its time budget, its
ratios and its summary on synthetic records, and the envs-only ceiling's processes. The whole
``--smoke`` run takes ~55 s on a loaded 2-core machine (2026-11-26), over this file's share of
CI, so it is not run here: run it by hand (``PYTHONPATH=src python -m bench.gpu --smoke --out
/tmp/gpu_smoke``)."""
from __future__ import annotations

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


def test_the_overlapped_default_is_an_overlapped_plan():
    from auturi.executor.layout import plan_layout

    assert all(a.overlap for a in plan_layout(gpu._config(gpu.OVERLAP)).actors)


def _run(kind: str, steps: int, learn: float, **kw) -> dict:
    return {"system": kind, "steps": steps, "build_seconds": 2.0, "learn_seconds": learn, **kw}


def test_ratios_are_against_plain_sb3_at_the_same_steps():
    runs = [_run("sb3_subproc", 100, 10.0), _run("wrap_dummy", 100, 20.0, wrap_seconds=5.0),
            _run("sb3_subproc", 300, 30.0), _run("fixed", 300, 25.0)]
    gpu._ratios(runs)
    assert runs[1]["vs_sb3_subproc"] == pytest.approx(0.5) and runs[1]["vs_sb3_subproc_with_wrap"] == pytest.approx(0.4)
    assert runs[3]["vs_sb3_subproc"] == pytest.approx(1.2)


def test_estimates_scale_the_shorter_run_and_know_nothing_before_it():
    runs = [_run("sb3_subproc", 100, 10.0), _run("wrap_dummy", 100, 20.0, wrap_seconds=1.0),
            _run("fixed", 100, 8.0)]
    assert gpu._estimate("fixed", 300, []) == 0.0
    assert gpu._estimate("sb3_subproc", 300, runs) == pytest.approx(2 + 10 + 20)
    # the online run: its shorter run (search paid) + the extra steps at the fixed layout's rate, 20% slack
    assert gpu._estimate("wrap_dummy", 300, runs) == pytest.approx(2 + 1 + 20 + 1.2 * 8 * 2)


def test_the_clock_refuses_what_would_overrun():
    c = gpu.Clock(100.0)
    assert c.allows(10.0) and not c.allows(1000.0)


def _records() -> tuple[dict, dict, dict]:
    cfg = "actors=1 x envs=32 | env_degree=16 | policies=1@cuda batch=32"
    runs = [_run("sb3_subproc", 32_768, 12.0, layout="SubprocVecEnv x 32"),
            _run("wrap_dummy", 32_768, 15.0, wrap_seconds=1.0, layout=cfg, vs_sb3_subproc=0.8,
                 vs_sb3_subproc_with_wrap=0.75,
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
                       "overlap": gpu.OVERLAP},
          "systems": {"envs_only": {"steps_per_second": {"median": 29_000.0}, "vs_envs_only": 1.0},
                      "sb3_subproc": {"steps_per_second": {"median": 8_000.0}, "vs_sb3_subproc": 1.0},
                      "auturi_tuned": {"steps_per_second": sps, "config": cfg, "vs_sb3_subproc": 2.5,
                                       "vs_envs_only": 0.69},
                      "auturi_overlap": {"error": "ValueError: no", "config": cfg, "overlap": [True]}},
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
    assert "15.0 (0.80x; 0.75x)" in row and row.count("|") == 4  # the config's own | are escaped
    assert "refused (EnvRebuildError)" in md and "error: RuntimeError: boom" in md
    assert "| plain SB3, SubprocVecEnv | 12.0 | skipped |" in md
    assert "at collect 3" in md and "| 0 | serial | 1.50 |" in md and "(2.50 s)" in md
    assert "| 20,000 | 2.50x | 69% |" in md and "error: ValueError: no" in md
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
