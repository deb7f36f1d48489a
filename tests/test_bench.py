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

EXPECTED_PEERS = ("auturi_tuned", "auturi_fixed", "dummy", "subproc", "async", "envpool", "envpool_async", "rllib_0")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    img_before = set((REPO / "docs/img").glob("*")) if (REPO / "docs/img").is_dir() else set()
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--workloads", "cartpole", "--no-docs",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=170, check=False)
    img_after = set((REPO / "docs/img").glob("*")) if (REPO / "docs/img").is_dir() else set()
    return proc, out, img_after - img_before


@pytest.mark.timeout(180)
def test_smoke_run_writes_json_markdown_and_plots(smoke):
    proc, out, new_doc_images = smoke
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
    for sec in ("collect", "e2e", "envstep"):
        png = out / f"bench_smoke_{sec}.png"
        assert f"]({png.name})" in md
        with PIL.open(png) as im:
            assert im.format == "PNG" and im.size[0] > 0 and im.size[1] > 0
    assert not new_doc_images, "--no-docs must leave docs/ alone"


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
    assert "--quick" in proc.stdout and "--no-docs" in proc.stdout
