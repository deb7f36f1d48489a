"""``/metrics`` follows Prometheus conventions: it parses strictly (prometheus_client's own
parser), its label sets are bounded (a long grid run adds no series), the phase is an enum whose
series never change, and training steps are a counter for ``rate()``."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
parser = pytest.importorskip("prometheus_client.parser")

from auturi import Config
from auturi.rollout import CollectStats
from auturi.server import PHASES, StatusSnapshot, create_app
from auturi.server.shape import _Reader

CONFIGS = [Config(num_actors=a, envs_per_actor=8 // a, policy_batch_size=b) for a in (1, 2, 4) for b in (1, 2)]


def trial_rows(n: int) -> list[dict]:
    """``n`` finished trials over a few configs, baselines first, as a tuner lists them."""
    rows = []
    for i in range(n):
        src = "start" if i == 0 else "serial" if i == 1 else "search"
        rows.append({"config": CONFIGS[i % len(CONFIGS)].to_dict(), "source": src, "status": "ok",
                     "median": 1000.0 + 10 * i, "n": 3, "samples": [1000.0 + 10 * i] * 3})
    return rows


def exposition(snap: StatusSnapshot) -> str:
    from auturi.server import render_metrics

    reader = _Reader(snap, {"cores": 2})
    return render_metrics(reader.status(), reader.trials())


def series(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, labels) -> value, through prometheus_client's parser (it raises on bad text)."""
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def snapshot(phase: str, n_trials: int) -> StatusSnapshot:
    snap = StatusSnapshot()
    snap.update(status={"phase": phase, "mode": "offline", "strategy": "grid", "trials": n_trials,
                        "trials_ok": n_trials, "best_config": CONFIGS[0].to_dict(), "best_throughput": 1234.5,
                        "current_config": CONFIGS[1].to_dict(), "budget_seconds_left": 3.0},
                trials=trial_rows(n_trials))
    return snap


def test_series_do_not_grow_with_trials_or_change_with_the_phase():
    few = series(exposition(snapshot("search", 3)))
    many = series(exposition(snapshot("search", 88)))
    assert set(few) == set(many), set(many) ^ set(few)
    assert len(many) < 60
    # A phase change moves a value, never a label set (an info metric with the phase made a new series).
    done = series(exposition(snapshot("final", 88)))
    assert set(done) == set(many)
    phase = {dict(k[1])["phase"]: v for k, v in many.items() if k[0] == "auturi_tuner_phase"}
    assert set(phase) == {*PHASES, "unknown"} and phase["search"] == 1 and sum(phase.values()) == 1
    odd = series(exposition(snapshot("a-phase-from-a-newer-tuner", 3)))
    assert {dict(k[1])["phase"] for k, v in odd.items() if k[0] == "auturi_tuner_phase" and v == 1} == {"unknown"}
    for key in many:  # no label carries a config or a trial index
        for label, value in key[1]:
            assert label in ("mode", "strategy", "phase", "trial", "config", "knob", "part"), key
            assert "actors=" not in value and not value.isdigit(), key


def test_trial_results_by_role():
    snap = snapshot("done", 10)
    got = series(exposition(snap))
    role = {dict(k[1])["trial"]: v for k, v in got.items() if k[0] == "auturi_tuner_trial_throughput_steps_per_second"}
    assert role == {"best": 1234.5, "start": 1000.0, "serial": 1010.0, "choice": 1234.5}
    # A confirm round of the start config supersedes its first measure.
    rows = trial_rows(10) + [{"config": CONFIGS[0].to_dict(), "source": "confirm", "status": "ok", "median": 999.0,
                              "n": 3, "samples": [999.0] * 3}]
    snap.update(trials=rows)
    role = {dict(k[1])["trial"]: v for k, v in series(exposition(snap)).items()
            if k[0] == "auturi_tuner_trial_throughput_steps_per_second"}
    assert role["start"] == 999.0 and role["serial"] == 1010.0
    knobs = {(dict(k[1])["config"], dict(k[1])["knob"]): v for k, v in got.items() if k[0] == "auturi_config_knob"}
    assert knobs[("best", "num_actors")] == CONFIGS[0].num_actors
    assert knobs[("current", "envs_per_actor")] == CONFIGS[1].envs_per_actor
    # The budget is shown only while the tuner searches.
    assert ("auturi_tuner_budget_seconds_left", ()) not in got
    assert series(exposition(snapshot("search", 3)))[("auturi_tuner_budget_seconds_left", ())] == 3.0


def test_collected_steps_are_a_counter_for_rate():
    snap = StatusSnapshot()
    snap.update(status={"phase": "locked", "mode": "fixed", "current_config": CONFIGS[0].to_dict()})
    assert not [k for k in series(exposition(snap)) if k[0].startswith("auturi_collect")]  # none recorded yet
    totals = []
    for i in range(3):
        snap.record_collect(CollectStats(steps=512, seconds=0.5, env_seconds=0.3, policy_seconds=0.1,
                                         wait_seconds=0.05 * i))
        totals.append(series(exposition(snap)))
    fams = {f.name: f.type for f in parser.text_string_to_metric_families(exposition(snap))}
    assert fams["auturi_collect_steps"] == "counter" and fams["auturi_collect_part_seconds"] == "counter"
    assert [t[("auturi_collect_steps_total", ())] for t in totals] == [512, 1024, 1536]
    assert totals[-1][("auturi_collects_total", ())] == 3
    assert totals[-1][("auturi_collect_seconds_total", ())] == pytest.approx(1.5)
    parts = {dict(k[1])["part"]: v for k, v in totals[-1].items() if k[0] == "auturi_collect_part_seconds_total"}
    assert parts == pytest.approx({"env": 0.9, "inference": 0.3, "waiting": 0.15})
    assert totals[-1][("auturi_throughput_steps_per_second", ())] == 1024.0


def test_metrics_route_parses_and_says_what_to_install_without_prometheus_client(monkeypatch):
    import sys

    import httpx

    snap = snapshot("search", 5)
    app = create_app(snap, hardware={"cores": 2})

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1") as c:
            return await c.get("/metrics")

    import asyncio

    r = asyncio.run(get())
    assert r.status_code == 200 and "version=0.0.4" in r.headers["content-type"]
    assert series(r.text)[("auturi_up", ())] == 1
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    r = asyncio.run(get())
    assert r.status_code == 503 and "pip install" in r.json()["detail"]


def test_every_metric_docs_cli_names_is_served():
    """docs/cli.md's /metrics row named three series no version served (2026-11-27)."""
    import re
    from pathlib import Path

    row = next(line for line in (Path(__file__).parent.parent / "docs" / "cli.md").read_text().splitlines()
               if line.startswith("| `GET /metrics`"))
    named = set(re.findall(r"`(auturi_[a-z_]+)", row))
    assert len(named) >= 10
    from auturi.server import render_metrics

    snap = snapshot("search", 3)
    snap.record_collect(CollectStats(steps=512, seconds=0.5, env_seconds=0.3, policy_seconds=0.1, wait_seconds=0.05))
    status = _Reader(snap, {"cores": 2}).status()
    status.update(searching=True, budget={"trials_left": 2, "seconds_left": 3.0}, best_low=1200.0, best_high=1300.0,
                  elapsed_seconds=1.0,
                  current_config=CONFIGS[1].to_dict(), best_config=CONFIGS[0].to_dict())
    text = render_metrics(status, _Reader(snap, {"cores": 2}).trials())
    served = {k[0] for k in series(text)} | {f.name for f in parser.text_string_to_metric_families(text)}
    # the interval's pair is written `auturi_tuner_best_low_steps_per_second` / `_high_`
    assert named - served == set(), named - served
