"""What the command line prints: the trials table, the choice with its ``auturi.Config(...)``
line, where each finalist's time goes and how close the choice comes to this machine's limit
for the workload, and the progress bar while tuning."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from auturi.cli.common import one_line

__all__ = ["NOTES", "SOURCES", "ProgressFeed", "config_line", "json_safe", "make_progress", "notes_help",
           "print_result", "trials_table", "trials_title"]


def config_line(config: Any) -> str:
    """The choice as a line of Python: ``auturi.Config(num_actors=..., ...)``."""
    args = ", ".join(f"{k}={v!r}" for k, v in config.to_dict().items())
    return f"auturi.Config({args})"


def fmt(x: Any, digits: int = 0) -> str:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return f"{x:,.{digits}f}"


NOTES = {
    "converged": "both ends of its interval came within 5% of its median",
    "slower": "stopped early: its interval lay wholly below the best config's",
    "max_samples": "stopped at the most samples a trial takes",
    "max_seconds": "stopped at --max-trial-seconds",
    "budget": "stopped when the budget ran out",
    "separated": "re-measure stopped: the fastest one's interval lay above all the others'",
    "max_rounds": "re-measure ran its most rounds",
    "confirm": ("re-measured after the choice, with start and serial, in interleaved rounds (at least 3 samples, "
                "more while the budget allows; each sample as many collects as the config's spread needs)"),
}
"""What each word of the table's note column means (the footer and --help print these)."""
SOURCES = {
    "start": "your --start layout (serial when not given)", "serial": "one actor, one env lane, one policy",
    "cache": "the choice cached from an earlier run", "search": "proposed by the strategy",
    "final": "re-measured interleaved to choose between close ones",
    "confirm": "re-measured after the choice: the numbers printed below the table",
}
INTERVAL_HELP = ("steps/s is the median of the n samples (steps per second of one sample: one or more back-to-back collects); interval is the "
                 "distribution-free interval of the median with its exact confidence: the samples' range below 6 "
                 "samples (75% at 3, 88% at 4, 94% at 5), >= 95% from 6; none below 3 samples")


def notes_help() -> str:
    """The note words, sources and interval, as the help text and the table footer say them."""
    return ("Notes: " + "; ".join(f"{k}: {v}" for k, v in NOTES.items()) + ". Sources: "
            + "; ".join(f"{k}: {v}" for k, v in SOURCES.items()) + ". " + INTERVAL_HELP + ".")


def trials_title(result: Any) -> str:
    """The table's title: the same counts as the "why" line (:meth:`TuneResult.counts`)."""
    k = result.counts()
    space = f" of {k['space']}" if k.get("space") is not None else ""
    return (f"Trials: {k['measured']} measured ({k['baselines']} baselines + {k['searched']} searched{space}), "
            f"{k['decided']} re-measured to choose, {k['confirmed']} confirmed; * = the choice's row, whose "
            f"numbers are printed below")


def trials_table(result: Any, title: str | None = None) -> Table:
    """The trials of a :class:`~auturi.tuner.TuneResult` as a rich table, in
    :meth:`~auturi.tuner.TuneResult.rows` order (the starred row, whose numbers the choice
    line prints, on top); the footer explains every note word and source it shows."""
    rows = result.rows()
    has_pred = any(t.predicted is not None for t in rows)
    table = Table(title=title, show_lines=False, header_style="bold", title_justify="left",
                  caption_justify="left")
    table.add_column("steps/s", justify="right")
    table.add_column("interval", justify="right")
    table.add_column("n", justify="right")
    if has_pred:
        table.add_column("predicted", justify="right")
    table.add_column("source")
    table.add_column("config", overflow="fold")
    table.add_column("note", overflow="fold")
    starred = result.choice_trial
    for t in rows:
        note = t.stop_reason or ""
        if not t.ok:
            note = f"{t.status}: {one_line(t.error or '')}"
        mark = " *" if t is starred else ""
        cells = [fmt(t.estimate) if t.ok else t.status, t.interval_text() if t.ok else "", str(t.n)]
        if has_pred:
            cells.append(fmt(t.predicted))
        cells += [t.source, f"{t.config}{mark}", note]
        table.add_row(*cells, style="bold green" if mark else None)
    words = [w for w in NOTES if any(t.stop_reason == w for t in rows)]
    sources = [s for s in SOURCES if any(t.source == s for t in rows)]
    table.caption = "; ".join([f"{w}: {NOTES[w]}" for w in words] + [f"{s}: {SOURCES[s]}" for s in sources]
                              + [INTERVAL_HELP])
    return table


def print_result(console: Console, result: Any, saved: Path | None = None) -> None:
    console.print(trials_table(result, title=trials_title(result)))
    sp_start, sp_serial = result.speedup("start"), result.speedup("serial")
    ct = result.choice_trial
    iv = ct.interval_text() if ct is not None else ""
    head = f"  {fmt(result.throughput)} steps/s" + (f", interval {iv}" if iv else "") + \
        (f", median of {ct.n} ({ct.source})" if ct is not None else "")
    console.print(f"[bold]Choice:[/bold] {result.choice}")
    console.print(head + (f"; {sp_serial:.2f}x serial" if math.isfinite(sp_serial) else ""), highlight=False,
                  markup=False, soft_wrap=True)
    if math.isfinite(sp_start) and result.start != type(result.choice).serial(result.choice.num_envs):
        console.print(f"  {sp_start:.2f}x the start config ({result.start})", markup=False, soft_wrap=True)
    if result.reason:
        console.print(f"  why: {result.reason}", soft_wrap=True, markup=False)
    print_explain(console, result)
    console.print(config_line(result.choice), soft_wrap=True, markup=False)
    if saved is not None:
        console.print(f"Saved: {saved}  (auturi show {saved})", soft_wrap=True, markup=False)


def limit_line(result: Any) -> str | None:
    """"the choice reaches 78% of what 2 cores can step (...)", from a
    :class:`~auturi.tuner.api.TuneReport`'s limit (:func:`~auturi.tuner.api.machine_limit`);
    None when it is unknown."""
    limit = getattr(result, "limit", None) or {}
    share = result.limit_share() if hasattr(result, "limit_share") else None
    if share is None:
        return None
    cores, top = limit.get("cores"), limit.get("steps_per_second")
    if top == limit.get("inference_steps_per_second"):
        what, by = "what inference allows", f"the best batched inference: {fmt(top)} steps/s"
    elif top == limit.get("concurrent_steps_per_second"):
        what, by = "what the envs allow", f"every env stepping at once in its own process: {fmt(top)} steps/s"
    else:
        what = f"what {cores} cores can step"
        by = (f"env stepping and inference sharing {cores} cores; the envs alone: "
              f"{fmt(limit.get('env_steps_per_second'))} steps/s")
    return f"the choice reaches {share:.0%} of {what} (limit {fmt(top)} steps/s: {by})"


def splits_table(result: Any) -> Table | None:
    """Each finalist's time split (env stepping, inference, waiting, IPC and the rest), from
    a :class:`~auturi.tuner.api.TuneReport`; None for a plain result."""
    splits = getattr(result, "splits", None)
    if not splits:
        return None
    from rich import box

    # no vertical rules: the trials table is the one whose rows carry "│" (and scripts read it)
    table = Table(title="Where each finalist's collect time goes (shares of the actors' summed time)",
                  header_style="bold", title_justify="left", box=box.SIMPLE)
    for name in ("env", "inference", "waiting", "ipc+other", "config"):
        table.add_column(name, justify="left" if name == "config" else "right")
    choice = result.choice.to_dict()
    for s in splits:
        sp = s["split"]
        mark = " *" if s["config"] == choice else ""
        table.add_row(*(f"{sp.get(k, 0.0):.0%}" for k in ("env", "inference", "waiting", "ipc")), s["label"] + mark,
                      style="bold green" if mark else None)
    return table


def print_explain(console: Console, result: Any) -> None:
    """The splits table and the limit line, when ``result`` carries them."""
    table = splits_table(result)
    if table is not None:
        console.print(table)
    line = limit_line(result)
    if line is not None:
        console.print(f"  {line}", markup=False, soft_wrap=True)


def json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


# ---------------------------------------------------------------------------- progress
class ProgressFeed:
    """The tuner callback: drives a rich progress bar and the status snapshot."""

    def __init__(self, progress: Any, snapshot: Any):
        self.progress, self.snapshot = progress, snapshot
        self.task = progress.add_task("starting", total=1000, best="-") if progress is not None else None

    def __call__(self, event: Any) -> None:
        try:
            if self.snapshot is not None:
                self.snapshot(event)
            if self.progress is not None:
                self._draw(event)
        except Exception:  # noqa: BLE001, S110 - a display problem must never stop tuning
            pass

    def _draw(self, event: Any) -> None:
        self.progress.update(self.task, **progress_fields(event))


def progress_fields(event: Any) -> dict[str, Any]:
    """The progress bar's fields for one tuner event: the share of the budget spent, and a
    description "search    trial 3 of at most 12, 9 s left  <config>".

    >>> from types import SimpleNamespace as E
    >>> progress_fields(E(status={"phase": "search", "trials": 2, "budget_trials": 10, "space": {"configs": 6},
    ...                           "budget_seconds": 20, "budget_seconds_left": 9.4,
    ...                           "current_config": None}))["description"]
    'search    trial 3 of at most 6, 9 s left'
    """
    from auturi.config import Config
    from auturi.tuner.api import trial_bound

    s = event.status
    fr = 0.0
    if s.get("budget_trials"):
        fr = max(fr, 1 - (s.get("budget_trials_left") or 0) / s["budget_trials"])
    if s.get("budget_seconds"):
        fr = max(fr, 1 - (s.get("budget_seconds_left") or 0) / s["budget_seconds"])
    phase = s.get("phase", "")
    if phase in ("final", "done"):
        fr = 1.0
    cur = s.get("current_config")
    left = s.get("budget_seconds_left")
    left_text = f", {left:.0f} s left" if isinstance(left, (int, float)) and s.get("budget_seconds") else ""
    if phase == "final":
        t = getattr(event, "trial", None)
        desc = f"{phase:<9} re-measuring{left_text}  {t.config if t is not None else ''}"
    else:
        bound = trial_bound(s)
        n = s.get("trials", 0) + 1  # the running trial, or the next one between trials
        what = f"  {Config.from_dict(cur)}" if cur else ""
        desc = f"{phase:<9} trial {n}" + (f" of at most {bound}" if bound else "") + left_text + what
    best = s.get("best_throughput")
    return {"completed": int(1000 * min(1.0, fr)), "description": desc,
            "best": f"best {fmt(best)} steps/s" if best else "best -"}


def make_progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), console=console, transient=True)


