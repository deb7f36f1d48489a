"""The status page in headless Chromium, in its two situations: during ``auturi tune`` (configs
ranked by throughput with intervals, the choice and its ``auturi.Config(...)`` line, the env,
the budget only while searching) and during training (throughput over wall time with the
reconfigures marked, the phase, and where the latest collect's time went).

Each view is checked twice: the DOM after the page's script ran (``--dump-dom``: what it
wrote) and a screenshot (that it was drawn: pixels in the plot colours).
CI installs Chromium with ``apt-get install -y chromium``; without it these tests skip.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")

from auturi import Config
from auturi.rollout import CollectStats
from auturi.server import LINE_COLOUR, StatusServer, StatusSnapshot

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install -y chromium")
BEST = "#2ca02c"
RECONFIGURE = "#d62728"


def chromium(url: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def screenshot(url: str, tmp: Path, size: tuple[int, int] = (1000, 900)) -> np.ndarray:
    """The page as RGB pixels (rows, columns, 3)."""
    png = tmp / "page.png"
    proc = chromium(url, tmp, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}")
    assert png.exists(), f"no screenshot (rc={proc.returncode}): {proc.stderr[-2000:]}"
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert img.shape[:2] == (size[1], size[0])
    return img


def dom(url: str, tmp: Path) -> str:
    """The DOM after the page's script drew it, without the script itself (its source names
    every label the page can show)."""
    proc = chromium(url, tmp, "--dump-dom")
    assert "<svg" in proc.stdout, f"no DOM (rc={proc.returncode}): {proc.stderr[-2000:]}"
    return re.sub(r"<script>.*?</script>", "", proc.stdout, flags=re.S)


def near(img: np.ndarray, colour: str) -> np.ndarray:
    want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return np.abs(img - want).sum(axis=2) < 40


def shown(html: str, element_id: str) -> bool:
    tag = re.search(rf'<[a-z]+ id="{element_id}"[^>]*>', html)
    assert tag, element_id
    return "hidden" not in tag.group(0) and "display: none" not in tag.group(0)


# ---------------------------------------------------------------------------- tuning
@pytest.fixture(scope="module")
def tuned():
    """A finished (real, serial-backend) tuning run's snapshot."""
    from tests.test_server import run_tuning

    snap = StatusSnapshot()
    tuner, result = run_tuning(snap)
    return snap, tuner, result


def test_tuning_view_ranks_configs_and_shows_the_choice(tuned, tmp_path):
    snap, tuner, result = tuned
    with StatusServer(snap) as srv:
        html = dom(srv.url, tmp_path)
        img = screenshot(srv.url, tmp_path)
    assert shown(html, "tune") and not shown(html, "train")
    choice = Config.from_dict(tuner.status()["best_config"])
    assert "auturi." + repr(choice) in html  # the line to paste into auturi.wrap(..., config=...)
    assert "Choice: " + str(choice) in html
    assert snap.status()["env"] and snap.status()["env"] in html
    assert "budget left" not in html  # tuning ended: no budget to show
    assert "throughput (env steps/s)" in html  # the axis says what it measures
    labels = {str(Config.from_dict(t["config"])) for t in tuner.trials() if t.get("median") is not None}
    bars = re.findall(r'<rect x="330"[^>]*fill="(#[0-9a-f]{6})"', html)
    assert len(bars) == len(labels) >= 2 and bars.count(BEST) == 1  # one bar per config, the choice green
    assert "<polyline" not in html  # no line through different configs
    assert near(img, LINE_COLOUR).sum() > 800 and near(img, BEST).sum() > 300, "the bars were not drawn"


def test_budget_is_shown_while_the_tuner_searches(tmp_path):
    snap = StatusSnapshot(env="CartPole-v1")
    snap.update(status={"phase": "search", "mode": "offline", "strategy": "grid", "trials": 1,
                        "budget_seconds_left": 12.0, "budget_trials_left": 4})
    with StatusServer(snap, hardware={"cores": 2}) as srv:
        html = dom(srv.url, tmp_path)
    assert "budget left: </b>4 trials, 12 s" in html and "env CartPole-v1" in html
    assert "waiting for the first measured trial" in html and not shown(html, "choice")


# ---------------------------------------------------------------------------- training
def training_snapshot() -> tuple[StatusSnapshot, Config, Config]:
    """Six collects under one layout, then a reconfigure and six under another."""
    first, second = Config.serial(8), Config(num_actors=2, envs_per_actor=4)
    snap = StatusSnapshot(env="CartPole-v1")
    snap.update(status={"phase": "locked", "mode": "fixed", "current_config": first.to_dict(), "trials": 0})
    t0 = time.time() - 10
    for i in range(12):
        cfg = first if i < 6 else second
        if i == 6:
            snap.update(current_config=cfg.to_dict())
        snap.record_collect(CollectStats(steps=1024, seconds=0.5 if i < 6 else 0.25, env_seconds=0.3 if i < 6 else 0.3,
                                         policy_seconds=0.1, wait_seconds=0.0 if i < 6 else 0.05),
                            at=t0 + (0.5 * i if i < 6 else 0.5 * i + 1.0))  # the reconfigure took 1 s
    return snap, first, second


def test_training_view_plots_throughput_over_time_with_reconfigures(tmp_path):
    snap, first, second = training_snapshot()
    with StatusServer(snap, hardware={"cores": 2}) as srv:
        html = dom(srv.url, tmp_path)
        img = screenshot(srv.url, tmp_path)
    assert shown(html, "train") and not shown(html, "tune")  # no trials: no ranking to show
    assert "wall time since the first recorded collect (s)" in html and "env steps/s" in html
    assert html.count("<polyline") == 2  # one line per layout, none across the reconfigure
    marks = re.findall(rf'<line [^>]*stroke="{RECONFIGURE}"[^>]*stroke-dasharray', html)
    assert len(marks) == 1  # one reconfigure, one mark, labelled with the new layout
    assert f'fill="{RECONFIGURE}">{second}</text>' in html
    assert "phase: </b>locked" in html and "collects: </b>12" in html and "env CartPole-v1" in html
    # Where the latest collect's time went: 0.25 s wall, 0.45 actor-seconds (2 actors) of which
    # env 0.3, inference 0.1, waiting 0.05.
    for part in ("env stepping 67%", "inference 22%", "waiting 11%"):
        assert part in html, part
    assert "summed over actors" in html and "other (scheduling" not in html and f"Layout {second}" in html
    assert not shown(html, "trials")
    line = near(img, LINE_COLOUR)
    _, cols = np.nonzero(line)
    assert line.sum() > 500 and cols.max() - cols.min() > 500, "the throughput line was not drawn across the plot"
    assert near(img, RECONFIGURE).sum() > 50, "the reconfigure was not marked"


def test_training_view_before_the_first_collect(tmp_path):
    snap = StatusSnapshot()
    snap.update(status={"phase": "explore", "mode": "online", "strategy": "model", "trials": 0,
                        "budget_seconds_left": 30.0})
    with StatusServer(snap, hardware={"cores": 2}) as srv:
        html = dom(srv.url, tmp_path)
    assert shown(html, "train") and "waiting for the first training collect" in html
    assert "no training collect recorded yet" in html and "budget left: </b>30 s" in html
