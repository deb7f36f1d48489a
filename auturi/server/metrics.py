"""``/metrics``: the status in the Prometheus text format."""
from collections.abc import Mapping, Sequence
from typing import Any

from auturi.server.schema import PHASES
from auturi.server.shape import _finite


def _label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> str:
    """The Prometheus text exposition (format 0.0.4) of a shaped status and trial list."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: Sequence[tuple[dict[str, Any], Any]]) -> None:
        rows = [(labels, _finite(v)) for labels, v in samples]
        rows = [(labels, v) for labels, v in rows if v is not None]
        if not rows:
            return
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, v in rows:
            lab = ",".join(f'{k}="{_label(x)}"' for k, x in labels.items())
            num = str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)
            lines.append(f"{name}{{{lab}}} {num}" if lab else f"{name} {num}")

    phase = str(status.get("phase") or "unknown")
    metric("auturi_up", "gauge", "1 while the status server answers.", [({}, 1)])
    metric("auturi_tuner_info", "gauge", "Mode, strategy and phase of the tuner (always 1).",
           [({"mode": status.get("mode") or "", "strategy": status.get("strategy") or "", "phase": phase}, 1)])
    phases = list(PHASES) + ([phase] if phase not in PHASES else [])
    metric("auturi_tuner_phase", "gauge", "1 for the current phase, 0 for the others.",
           [({"phase": p}, int(p == phase)) for p in phases])
    metric("auturi_tuner_trials_total", "counter", "Trials finished.", [({}, status.get("trials_done"))])
    metric("auturi_tuner_trials_ok_total", "counter", "Trials finished with a measurement.",
           [({}, status.get("trials_ok"))])
    metric("auturi_tuner_best_throughput_steps_per_second", "gauge", "Best throughput measured (median of its samples).",
           [({"config": status.get("best_config_label") or ""}, status.get("best_throughput"))])
    metric("auturi_tuner_best_half_width_steps_per_second", "gauge", "Larger distance from the best median to an end of its interval.",
           [({}, status.get("best_half_width"))])
    metric("auturi_tuner_throughput_steps_per_second", "gauge", "Throughput of the latest measured collect.",
           [({}, status.get("throughput_now"))])
    metric("auturi_tuner_current_samples", "gauge", "Samples of the trial running now.",
           [({}, status.get("current_samples"))])
    budget = status.get("budget") or {}
    metric("auturi_tuner_budget_trials_left", "gauge", "Trials the budget still allows.",
           [({}, budget.get("trials_left"))])
    metric("auturi_tuner_budget_seconds_left", "gauge", "Seconds the budget still allows.",
           [({}, budget.get("seconds_left"))])
    metric("auturi_tuner_elapsed_seconds", "gauge", "Seconds since tuning began.",
           [({}, status.get("elapsed_seconds"))])
    metric("auturi_trial_throughput_steps_per_second", "gauge", "Mean throughput of each trial.",
           [({"index": t["index"], "source": t.get("source", ""), "config": t.get("label", "")}, t.get("mean"))
            for t in trials])
    metric("auturi_trial_samples", "gauge", "Measured collects of each trial.",
           [({"index": t["index"], "source": t.get("source", ""), "config": t.get("label", "")}, t.get("n"))
            for t in trials])
    return "\n".join(lines) + "\n"
