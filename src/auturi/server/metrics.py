"""``/metrics``: the status in the Prometheus text format (0.0.4), written by
``prometheus_client`` (in the ``server`` extra).

Every label set is bounded, so a long run or a big grid adds no series: no per-trial label
(the trials are in ``/trials``), the phase as one 0/1 gauge per known phase (an enum), trial
results as a fixed set of roles (``best``, ``current``, ``start``, ``serial``, ``choice``), and
configs as their numeric knobs under two roles (``current``, ``best``). Steps, collects and
their seconds are counters, for ``rate()``: ``rate(auturi_collect_steps_total[1m])`` is the
training throughput; ``rate(auturi_collect_part_seconds_total{part="env"}[1m]) /
rate(auturi_collect_seconds_total[1m])`` the share of time spent stepping envs.
"""
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from auturi.server.schema import PHASES
from auturi.server.shape import _finite

TRIAL_ROLES = ("best", "current", "start", "serial", "choice")
"""The ``trial`` label's values: the only trial results exported (bounded)."""
PARTS = (("env", "env_seconds"), ("inference", "policy_seconds"), ("waiting", "wait_seconds"))
"""The ``part`` label's values and the status fields they read."""
NUMERIC_KNOBS = ("num_actors", "envs_per_actor", "env_parallel_degree", "policies_per_actor", "policy_batch_size")

MISSING = ("/metrics needs prometheus_client: pip install 'auturi[server]' (or pip install prometheus-client)")


def render_metrics(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> str:
    """The Prometheus text exposition (format 0.0.4) of a shaped status and trial list.

    Raises:
        ImportError: prometheus_client is not installed (the message says what to install).
    """
    try:
        from prometheus_client import CollectorRegistry, generate_latest
    except ImportError as e:
        raise ImportError(MISSING) from e

    class _Once:
        def collect(self) -> Iterator[Any]:
            return _families(status, trials)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())
    return generate_latest(registry).decode()


def _families(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    def gauge(name: str, help_: str, value: Any) -> Iterator[Any]:
        v = _finite(value)
        if v is not None:
            yield GaugeMetricFamily(name, help_, value=v)

    yield GaugeMetricFamily("auturi_up", "1 while the status server answers.", value=1)
    # mode and strategy are fixed for a run, so this info series never changes labels.
    yield InfoMetricFamily("auturi_tuner", "Mode and strategy of the run.",
                           value={"mode": str(status.get("mode") or ""), "strategy": str(status.get("strategy") or "")})
    phase = str(status.get("phase") or "unknown")
    phases = GaugeMetricFamily("auturi_tuner_phase", "1 for the current phase, 0 for the others (an enum).",
                               labels=["phase"])
    for p in (*PHASES, "unknown"):
        phases.add_metric([p], int(p == phase or (p == "unknown" and phase not in PHASES)))
    yield phases
    yield from _counters(status, CounterMetricFamily)
    yield from gauge("auturi_throughput_steps_per_second", "Throughput of the latest measured collect.",
                     status.get("throughput_now"))
    yield from gauge("auturi_tuner_current_samples", "Samples of the trial running now.", status.get("current_samples"))
    budget = status.get("budget") or {}
    if status.get("searching"):  # a budget left after the search ended would read as time still to spend
        yield from gauge("auturi_tuner_budget_trials_left", "Trials the budget still allows.", budget.get("trials_left"))
        yield from gauge("auturi_tuner_budget_seconds_left", "Seconds the budget still allows.",
                         budget.get("seconds_left"))
    yield from gauge("auturi_tuner_elapsed_seconds", "Seconds since tuning began.", status.get("elapsed_seconds"))
    yield from _trial_roles(status, trials, GaugeMetricFamily)
    yield from _knobs(status, GaugeMetricFamily)


def _counters(status: Mapping[str, Any], Counter: Any) -> Iterator[Any]:
    """Trials, and the recorded collects' steps and seconds (present once a collect is recorded)."""
    for name, help_, key in (("auturi_tuner_trials", "Trials finished.", "trials_done"),
                             ("auturi_tuner_trials_ok", "Trials finished with a measurement.", "trials_ok")):
        yield Counter(name, help_, value=_finite(status.get(key)) or 0)
    if status.get("collects_total") is None:
        return
    yield Counter("auturi_collect_steps", "Env steps collected by training (rate() is the throughput).",
                  value=_finite(status.get("steps_total")) or 0)
    yield Counter("auturi_collects", "Training collects.", value=_finite(status.get("collects_total")) or 0)
    totals = status.get("seconds_total") or {}
    yield Counter("auturi_collect_seconds", "Wall seconds spent in training collects.",
                  value=_finite(totals.get("wall")) or 0)
    parts = Counter("auturi_collect_part_seconds", "Seconds of the collects by part, summed over actors "
                    "(env: stepping envs, inference, waiting: blocked on a worker).", labels=["part"])
    for part, key in PARTS:
        parts.add_metric([part], _finite(totals.get(key)) or 0)
    yield parts


def _trial_roles(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]], Gauge: Any) -> Iterator[Any]:
    """Throughput of the trials that matter, by role: a fixed label set however many trials run."""
    by_role: dict[str, Any] = {"best": status.get("best_throughput")}
    # The baselines' own trials, then their confirm rounds (the figures the CLI prints) supersede them.
    labels = {role: next((t.get("label") for t in trials if t.get("source") == role), None) for role in ("start", "serial")}
    for t in trials:
        mean = _finite(t.get("mean"))
        for role, label in labels.items():
            if mean is not None and t.get("source") in (role, "confirm") and t.get("label") == label:
                by_role[role] = mean
    running = [t for t in trials if t.get("status") == "running"]
    if running:
        by_role["current"] = running[-1].get("mean")
    if status.get("phase") in ("done", "locked") and status.get("best_config"):
        by_role["choice"] = status.get("best_throughput")
    g = Gauge("auturi_tuner_trial_throughput_steps_per_second",
              "Median throughput of the trial in each role (best so far, running now, the start and serial "
              "baselines, the final choice).", labels=["trial"])
    for role in TRIAL_ROLES:
        v = _finite(by_role.get(role))
        if v is not None:
            g.add_metric([role], v)
    yield g
    for name, key in (("auturi_tuner_best_low_steps_per_second", "best_low"),
                      ("auturi_tuner_best_high_steps_per_second", "best_high")):
        v = _finite(status.get(key))
        if v is not None:
            yield Gauge(name, f"{'Lower' if key == 'best_low' else 'Upper'} end of the best median's interval.",
                        value=v)


def _knobs(status: Mapping[str, Any], Gauge: Any) -> Iterator[Any]:
    """The current and best configs' numeric knobs: 2 x 5 series; a reconfigure changes values,
    never labels."""
    g = Gauge("auturi_config_knob", "A numeric knob of the current or the best config.", labels=["config", "knob"])
    for role in ("current", "best"):
        cfg = status.get(f"{role}_config")
        if isinstance(cfg, Mapping):
            for k in NUMERIC_KNOBS:
                v = _finite(cfg.get(k))
                if v is not None:
                    g.add_metric([role, k], v)
    yield g
