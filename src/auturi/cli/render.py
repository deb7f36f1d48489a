"""What the command line prints: the trials table (one row per config), the choice with its
``auturi.Config(...)`` line, whether it is clearly faster than the start, where each
finalist's time goes, how close the choice comes to this machine's limit, and the progress
bar while tuning.

Everything here fits a terminal of 80 columns (as of 2026-11-26, tests/test_cli_render.py
renders at 80): configs are written compactly (:func:`compact`, ``2x8 d2 p1@cpu b8``), the
legend is one short paragraph (the words are in ``auturi tune --help`` and docs/cli.md), and
prose is wrapped at spaces (:func:`say`), never inside a word, a path, an option name or a
config.

Over 400 lines because the table, the choice block and the progress bar share the config
notation and the wrapping rules, and reading them together keeps the output consistent."""
from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from auturi.cli.common import one_line

__all__ = ["LEGEND", "NOTES", "SOURCES", "ProgressFeed", "compact", "config_line", "config_rows", "json_safe",
           "make_progress", "noise_line", "notes_help", "print_result", "say", "trials_table", "trials_title"]


# ---------------------------------------------------------------------------- configs
def compact(config: Any) -> str:
    """A config (or its dict) in the short notation of the tables: ``2x8 d2 p1@cpu b8`` is 2
    actors x 8 envs per actor, env-parallel degree 2, 1 policy replica on cpu, batch 8.

    >>> from auturi import Config
    >>> compact(Config(num_actors=2, envs_per_actor=8, env_parallel_degree=2))
    '2x8 d2 p1@cpu b8'
    """
    c = config if isinstance(config, dict) else config.to_dict()
    batch = c.get("policy_batch_size") or c["envs_per_actor"]
    return (f"{c['num_actors']}x{c['envs_per_actor']} d{c.get('env_parallel_degree', 1)} "
            f"p{c.get('policies_per_actor', 1)}@{c.get('policy_device', 'cpu')} b{batch}")


CONFIG_PREFIX = "auturi.Config("


def config_line(config: Any, width: int | None = None) -> str:
    """The config as Python: ``auturi.Config(num_actors=2, envs_per_actor=4)``, with the knobs
    that differ from their defaults (the same Config: ``policy_batch_size`` defaults to
    ``envs_per_actor``). With ``width``, a line longer than that continues, as valid Python,
    on lines aligned after the parenthesis.

    >>> from auturi import Config
    >>> config_line(Config(num_actors=2, envs_per_actor=4, policy_batch_size=4))
    'auturi.Config(num_actors=2, envs_per_actor=4)'
    """
    d = config.to_dict()
    base = type(config)(num_actors=config.num_actors, envs_per_actor=config.envs_per_actor).to_dict()
    args = [f"{k}={v!r}" for k, v in d.items() if k in ("num_actors", "envs_per_actor") or v != base[k]]
    one = f"{CONFIG_PREFIX}{', '.join(args)})"
    if width is None or len(one) <= width:
        return one
    lines, cur = [], CONFIG_PREFIX
    for i, a in enumerate(args):
        piece = a + (")" if i == len(args) - 1 else ",")
        if cur.endswith(",") and len(cur) + 1 + len(piece) > width:
            lines.append(cur)
            cur = " " * len(CONFIG_PREFIX) + piece
        else:
            cur += (" " if cur.endswith(",") else "") + piece
    return "\n".join(lines + [cur])


def fmt(x: Any, digits: int = 0) -> str:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return f"{x:,.{digits}f}"


def interval(trial: Any) -> str:
    """``"7,845-11,067"``, or ``""`` below 3 samples (no interval)."""
    lo, hi = trial.low, trial.high
    return f"{lo:,.0f}-{hi:,.0f}" if math.isfinite(lo) and math.isfinite(hi) else ""


# ---------------------------------------------------------------------------- words
NOTES = {
    "converged": "its interval came within 5% of its median",
    "slower": "stopped early: clearly slower than the best",
    "max_samples": "took the most samples a trial takes",
    "max_seconds": "stopped at --max-trial-seconds",
    "budget": "stopped when the budget ran out",
    "separated": "re-measure ended: one was clearly the fastest",
    "max_rounds": "re-measure ran its most rounds",
    "confirm": "re-measured after the choice, with start and serial, interleaved",
    "interrupted": "the run was interrupted while measuring it",
}
"""Why a trial stopped (the table's note column; ``auturi tune --help`` lists them)."""
SOURCES = {
    "confirm": "re-measured after the choice, interleaved with start and serial: the choice's figures",
    "final": "re-measured interleaved to choose between close ones",
    "search": "proposed by the strategy",
    "start": "your --start layout (serial when not given)",
    "serial": "1 actor, its envs in-process, 1 policy",
    "cache": "the choice cached by an earlier run",
}
"""Which measurement a row's figure comes from (the table's from column)."""
INTERVAL_HELP = ("steps/s is the median of n samples; the interval is the median's range, 75% sure at n=3, 88% "
                 "at 4, 94% at 5, at least 95% from 6")
LEGEND = ("config 2x8 d2 p1@cpu b8: 2 actors x 8 envs each, env degree 2, 1 policy on cpu, batch 8. "
          "interval: the median's range, 75% sure at n=3, 88% at 4, 94% at 5, >=95% from 6. "
          "Words: auturi tune --help.")
"""The table's one legend: the config notation and the interval (the words: --help)."""


def notes_help() -> str:
    """The epilog of ``auturi tune --help``: the table's notation and every word it uses."""
    return ("Output: one row per config, with its last figure; * is the choice. A config "
            "2x8 d2 p1@cpu b8 is 2 actors x 8 envs each (num_actors, envs_per_actor), env "
            "degree 2 (env_parallel_degree), 1 policy replica (policies_per_actor) on cpu "
            "(policy_device), inference batch 8 (policy_batch_size). " + INTERVAL_HELP + ".\n\n"
            "From: " + "; ".join(f"{k}: {v}" for k, v in SOURCES.items()) + ".\n\n"
            "Notes: " + "; ".join(f"{k}: {v}" for k, v in NOTES.items() if k != "confirm") + ".\n\n"
            "More in docs/cli.md.")


COMPACT = re.compile(r"\b\d+x\d+ d\d+ p\d+@\S+ b\d+\b")
"""A config in :func:`compact`'s notation, inside text."""
_NBSP = "\xa0"  # textwrap breaks at ASCII whitespace only: a config's spaces become these while wrapping


def say(console: Console, text: str, indent: str = "", hang: str | None = None, style: str | None = None) -> None:
    """Print ``text`` wrapped to the console's width at spaces: a word, a path, an option
    name or a config (``2x8 d2 p1@cpu b8``) is never cut (one longer than the line stands
    alone on its line)."""
    text = COMPACT.sub(lambda m: m.group(0).replace(" ", _NBSP), text)
    lines = textwrap.wrap(text, max(20, console.width), initial_indent=indent,
                          subsequent_indent=indent if hang is None else hang,
                          break_long_words=False, break_on_hyphens=False)
    for line in lines or [indent]:
        console.print(line.replace(_NBSP, " "), markup=False, highlight=False, soft_wrap=True, style=style)


# ---------------------------------------------------------------------------- the table
@dataclass
class Row:
    """One config of a result: the trial whose figure is shown, and its roles."""

    trial: Any
    roles: list[str]
    stage: int  # 0: confirm rounds, 1: the re-measure that chose, 2: the search and baselines
    chosen: bool
    predicted: float | None = None  # the model strategy's prediction for the config, from any of its trials


def config_rows(result: Any) -> list[Row]:
    """One row per config a :class:`~auturi.tuner.TuneResult` measured, with its last
    figure: the confirm rounds', else the re-measure's, else its latest search trial's (the
    order :attr:`~auturi.tuner.TuneResult.choice_trial` reads them in). The choice first,
    then the confirm rounds, the re-measure and the search, fastest first within each."""
    from auturi.tuner.space import serial_baseline

    confirm = [t for t in result.final if t.source == "confirm"]
    decide = [t for t in result.final if t.source != "confirm"]
    figure: dict[Any, Any] = {}
    for t in confirm + decide + result.trials[::-1]:
        if t.ok and t.config not in figure:
            figure[t.config] = t
    for t in (result.trials + result.final)[::-1]:  # never measured: its last attempt and why
        figure.setdefault(t.config, t)
    serial = serial_baseline(result.start)
    cached = {t.config for t in result.trials if t.source == "cache"}
    predicted = {t.config: t.predicted for t in result.trials + result.final if t.predicted is not None}
    rows = []
    for cfg, t in figure.items():
        roles = [r for r, yes in (("start", cfg == result.start), ("serial", cfg == serial),
                                  ("cache", cfg in cached)) if yes]
        stage = {"confirm": 0, "final": 1}.get(t.source, 2)
        rows.append(Row(t, roles, stage, t.ok and cfg == result.choice, predicted.get(cfg)))
    return sorted(rows, key=lambda r: (not r.chosen, r.stage, -r.trial.score()))


def trials_title(result: Any) -> str:
    """The counts above the table (the "why" line says the same)."""
    k = result.counts()
    space = f" of {k['space']}" if k.get("space") is not None else ""
    parts = [f"{k['measured']} configs measured ({k['baselines']} baseline{'s' * (k['baselines'] != 1)} + "
             f"{k['searched']}{space} searched)"]
    if k["decided"]:
        parts.append(f"{k['decided']} re-measured to choose")
    if k["confirmed"]:
        parts.append(f"{k['confirmed']} confirmed")
    return "Trials: " + ", ".join(parts)


def trials_table(result: Any, width: int = 80) -> Table:
    """The result's :func:`config_rows` as a rich table without vertical rules, the stages
    apart; the model's predictions show from 100 columns (they are in the JSON record)."""
    rows = config_rows(result)
    wide = width >= 100 and any(r.predicted is not None for r in rows)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("", no_wrap=True)
    table.add_column("steps/s", justify="right", no_wrap=True)
    table.add_column("interval", justify="right", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    if wide:
        table.add_column("predicted", justify="right", no_wrap=True)
    table.add_column("config", no_wrap=True)
    table.add_column("from", no_wrap=True)
    table.add_column("note")
    for i, r in enumerate(rows):
        t = r.trial
        words = [x for x in r.roles if x != t.source]
        if t.ok and t.stop_reason and t.stop_reason not in ("confirm", t.source):
            words.append(t.stop_reason)
        cells = ["*" if r.chosen else "", fmt(t.estimate) if t.ok else t.status, interval(t) if t.ok else "",
                 str(t.n)]
        if wide:
            cells.append(fmt(r.predicted))
        cells += [compact(t.config), t.source, ", ".join(words)]
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        table.add_row(*cells, style="bold green" if r.chosen else None,
                      end_section=nxt is not None and nxt.stage != r.stage)
    return table


# ---------------------------------------------------------------------------- the choice
def noise_line(result: Any) -> str | None:
    """A choice other than the start whose interval reaches the start's (from the same
    rounds) is within the noise: the sentence that says so, else None."""
    ct, ref = result.choice_trial, result.reference_trial("start")
    if ct is None or ref is None or not (ct.ok and ref.ok) or ct.config == ref.config:
        return None
    yours = f"yours (the start, {compact(ref.config)})"
    sp = ct.estimate / ref.estimate if ref.estimate > 0 else math.nan
    if not (math.isfinite(ct.low) and math.isfinite(ref.high)):
        return (f"Too few samples to tell whether it is faster than {yours}: an interval needs 3; "
                f"measure longer (--budget-seconds).")
    if ct.low > ref.high:
        return None
    return (f"No layout is clearly faster than {yours}: the choice's interval {interval(ct)} reaches the "
            f"start's {interval(ref)}, so its {sp:.2f}x is within this machine's noise. Keep yours, or "
            f"measure longer (--budget-seconds).")


def in_short(result: Any, text: str) -> str:
    """``text`` (the tuner's "why") with each config of ``result`` in the tables' notation."""
    for c in {t.config for t in result.trials + result.final} | {result.start, result.choice}:
        text = text.replace(str(c), compact(c))
    return text


def print_result(console: Console, result: Any, saved: Path | None = None, cached_from: Path | None = None) -> None:
    """The table, the choice, its ratios and whether it is clearly faster than the start,
    the "why", the time splits and limit, and the ``auturi.Config(...)`` line."""
    say(console, trials_title(result))
    console.print(trials_table(result, console.width))
    for r in config_rows(result):
        if not r.trial.ok and r.trial.error:
            say(console, f"{compact(r.trial.config)} {r.trial.status}: {one_line(r.trial.error)}", "  ", "    ")
    say(console, LEGEND, style="dim")
    ct = result.choice_trial
    say(console, f"Choice: {compact(result.choice)}", style="bold")
    sp_start, sp_serial = result.speedup("start"), result.speedup("serial")
    head = f"{fmt(result.throughput)} steps/s"
    if ct is not None:
        iv = interval(ct)
        head += (f", interval {iv} ({ct.confidence:.0%})" if iv else "") + f", median of {ct.n}"
    say(console, head + (f"; {sp_serial:.2f}x serial" if math.isfinite(sp_serial) else ""), "  ", "    ")
    if math.isfinite(sp_start) and result.start != type(result.choice).serial(result.choice.num_envs):
        say(console, f"{sp_start:.2f}x the start config ({compact(result.start)})", "  ", "    ")
    noise = noise_line(result)
    if noise:
        say(console, noise, "  ", "  ", style="yellow")
    if result.cache_hit:
        where = f"the choice cached in {cached_from}" if cached_from is not None else "a cached choice"
        say(console, f"Cache: this run started from {where} (auturi tune --no-cache measures afresh)", "  ",
            "    ")
    if result.reason:
        say(console, f"why: {in_short(result, result.reason)}", "  ", "    ")
    print_explain(console, result)
    console.print(config_line(result.choice, console.width), soft_wrap=True, markup=False, highlight=False)
    if saved is not None:
        say(console, f"Saved: {saved} (auturi show {saved})")


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
        dev = limit.get("inference_device") or "cpu"
        shared = "env stepping and inference" if dev == "cpu" else f"env stepping and the host side of {dev} inference"
        loaded = limit.get("loaded_env_steps_per_second")
        envs = fmt(limit.get("env_steps_per_second")) + " steps/s"
        if limit.get("env_loaded") == "measured":
            envs += ", measured with every core busy"
        elif loaded:
            envs += f" ({fmt(loaded)} with every core busy, as fitted)"
        by = f"{shared} sharing {cores} cores; the envs alone: {envs}"
    return f"the choice reaches {share:.0%} of {what} (limit {fmt(top)} steps/s: {by})"


def splits_table(result: Any) -> Table | None:
    """Each finalist's time split (env stepping, inference, waiting, IPC and the rest), from
    a :class:`~auturi.tuner.api.TuneReport`; None for a plain result."""
    splits = getattr(result, "splits", None)
    if not splits:
        return None
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column("", no_wrap=True)
    for name in ("env", "inference", "waiting", "ipc+other"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("config", no_wrap=True)
    choice = result.choice.to_dict()
    for s in splits:
        sp = s["split"]
        chosen = s["config"] == choice
        table.add_row("*" if chosen else "", *(f"{sp.get(k, 0.0):.0%}" for k in ("env", "inference", "waiting", "ipc")),
                      compact(s["config"]), style="bold green" if chosen else None)
    return table


def print_explain(console: Console, result: Any) -> None:
    """The splits table and the limit line, when ``result`` carries them."""
    table = splits_table(result)
    if table is not None:
        say(console, "Where each finalist's collect time goes (shares of the actors' time):")
        console.print(table)
    line = limit_line(result)
    if line is not None:
        say(console, line, "  ", "    ")


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
        self.task = progress.add_task("starting", total=1000, best="-", best_short="") if progress is not None else None

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
    description "search    trial 3 of at most 12, 9 s left  2x4 d1 p1@cpu b4".

    >>> from types import SimpleNamespace as E
    >>> progress_fields(E(status={"phase": "search", "trials": 2, "budget_trials": 10, "space": {"configs": 6},
    ...                           "budget_seconds": 20, "budget_seconds_left": 9.4,
    ...                           "current_config": None}))["description"]
    'search    trial 3 of at most 6, 9 s left'
    """
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
    if phase == "done":
        desc = "done"
    elif phase == "final":
        t = getattr(event, "trial", None)
        desc = f"{phase:<9} re-measuring{left_text}  {compact(t.config) if t is not None else ''}"
    else:
        bound = trial_bound(s)
        n = s.get("trials", 0) + 1  # the running trial, or the next one between trials
        what = f"  {compact(cur)}" if cur else ""
        desc = f"{phase:<9} trial {n}" + (f" of at most {bound}" if bound else "") + left_text + what
    best = s.get("best_throughput")
    return {"completed": int(1000 * min(1.0, fr)), "description": desc.rstrip(),
            "best": f"best {fmt(best)} steps/s" if best else "best -",
            "best_short": f"best {fmt(best)}" if best else ""}


def make_progress(console: Console) -> Any:
    """The progress display on ``console`` (stderr): below 100 columns the description and
    the best so far only (the description says the trial and the seconds left), so it stays
    one line at 80; wider, a bar and the elapsed time too."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if console.width < 100:
        return Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.fields[best_short]}"),
                        console=console, transient=True)
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), console=console, transient=True)
