"""What ``auturi tune`` and ``auturi show`` print, rendered in-process at 80 columns from
made-up results (no tuning: fast, and the cases a short real run rarely hits: a config
measured in several stages, six-digit throughputs, the longest config, a failed trial, a
choice within the noise of the start), and ``auturi tune --help`` at 80 columns."""
from __future__ import annotations

import ast
import io
import re

import pytest

pytest.importorskip("typer")
pytest.importorskip("rich")

from rich.console import Console  # noqa: E402

from auturi import Config  # noqa: E402
from auturi.cli.render import compact, config_line, config_rows, noise_line, print_result  # noqa: E402
from auturi.tuner.api import TuneReport  # noqa: E402
from auturi.tuner.measure import Trial  # noqa: E402

COMPACT = re.compile(r"\b\d+x\d+ d\d+ p\d+@(?:cpu|cuda(?::\d+)?) b\d+\b")
LONGEST = Config(num_actors=16, envs_per_actor=16, env_parallel_degree=16, policies_per_actor=16,
                 policy_device="cuda:0", policy_batch_size=8)


def trial(config: Config, samples: list[float], source: str, stop: str = "converged", **kw) -> Trial:
    return Trial(config=config, samples=list(samples), status=kw.pop("status", "ok"), source=source,
                 stop_reason=stop, **kw)


def made_up(scale: float = 1.0, noisy: bool = True, cached: bool = False) -> TuneReport:
    """The issue's table: one config (``mid``) measured as a search trial at 16,333 [3,191,
    46,212], re-measured at 26,429 to choose and confirmed at 25,000 (and, when ``cached``,
    measured first as the cached choice at 51,458); its confirm interval reaches the
    start's when ``noisy``."""
    k = scale
    start = Config.serial(16)
    mid = Config(num_actors=2, envs_per_actor=8)
    confirm = [24_000, 25_000, 26_500] if noisy else [30_000, 31_000, 32_000]
    trials = ([trial(mid, [51_458 * k, 50_000 * k, 52_000 * k], "cache")] if cached else []) + [
        trial(start, [20_000 * k, 21_000 * k, 22_000 * k], "start", "max_samples"),
        trial(mid, [16_333 * k, 3_191 * k, 46_212 * k], "search", predicted=19_000 * k),
        trial(LONGEST, [900 * k], "search", "slower", predicted=12_345 * k),
        trial(Config(num_actors=4, envs_per_actor=4), [], "search", "", status="failed",
              error="WorkerError: env worker 3 of actor 1 died (exit code -9, SIGKILL): out of memory? see dmesg"),
    ]
    final = [trial(mid, [26_429 * k, 25_000 * k, 27_000 * k, 26_000 * k], "final", "separated"),
             trial(start, [22_000 * k, 21_000 * k, 23_500 * k, 22_500 * k], "final", "separated"),
             trial(mid, [x * k for x in confirm], "confirm", "confirm"),
             trial(start, [21_000 * k, 22_000 * k, 26_000 * k], "confirm", "confirm")]
    why = (f"4 configs measured; {mid} measured first; a reason long enough to wrap over several lines at eighty "
           f"columns, which must break between words only")
    return TuneReport(choice=mid, reason=why, trials=trials, final=final, start=start, num_steps=64,
                      space={"configs": 50}, cache_hit=cached,
                      splits=[{"config": c.to_dict(), "label": str(c),
                               "split": {"env": 0.4, "inference": 0.3, "waiting": 0.1, "ipc": 0.2}}
                              for c in (mid, LONGEST)],
                      limit={"cores": 2, "steps_per_second": 30_000 * k, "env_steps_per_second": 60_000 * k})


def render(result: TuneReport, width: int = 80, **kw) -> str:
    buf = io.StringIO()
    print_result(Console(file=buf, width=width, force_terminal=False, highlight=False), result, **kw)
    return buf.getvalue()


def check_80_columns(text: str) -> None:
    """No line past 80 columns, and no cell cropped with an ellipsis."""
    for line in text.splitlines():
        assert len(line) <= 80, line
    assert "…" not in text and "..." not in text


def test_compact_notation_and_config_line_round_trip():
    c = Config(num_actors=2, envs_per_actor=8, env_parallel_degree=2)
    assert compact(c) == "2x8 d2 p1@cpu b8" == compact(c.to_dict())
    assert compact(LONGEST) == "16x16 d16 p16@cuda:0 b8"
    for config in (Config.serial(8), c, LONGEST, Config(num_actors=4, envs_per_actor=2, policy_batch_size=1)):
        one = config_line(config)
        assert "\n" not in one
        wrapped = config_line(config, width=60)
        assert all(len(line) <= 60 for line in wrapped.splitlines()), wrapped
        for text in (one, wrapped):  # valid Python giving the same Config, on one or several lines
            call = ast.parse(text, mode="eval").body
            assert Config(**{k.arg: ast.literal_eval(k.value) for k in call.keywords}) == config
    assert config_line(Config(num_actors=2, envs_per_actor=4)) == "auturi.Config(num_actors=2, envs_per_actor=4)"
    assert "\n" in config_line(LONGEST, width=80)  # 131 characters on one line


@pytest.mark.parametrize("scale", [1.0, 10.0])  # five- and six-digit throughputs
def test_the_report_reads_at_80_columns(scale):
    text = render(made_up(scale, cached=True), cached_from="/home/someone/.cache/auturi/0123456789abcdef.json")
    check_80_columns(text)
    for c in (Config.serial(16), Config(num_actors=2, envs_per_actor=8), LONGEST, Config(num_actors=4,
                                                                                          envs_per_actor=4)):
        assert any(compact(c) in line for line in text.splitlines()), (compact(c), text)  # whole on a line
    # prose wraps between words: every word of the why line is whole on some line
    flat = " ".join(text.split())
    assert "a reason long enough to wrap over several lines at eighty columns, which must break between" in flat
    assert "why: 4 configs measured; 2x8 d1 p1@cpu b8 measured first" in flat  # the tuner's str(config), short
    assert "env worker 3 of actor 1 died (exit code -9, SIGKILL): out of memory? see dmesg" in flat
    assert sum(1 for line in text.splitlines() if line.startswith("config 2x8 d2 p1@cpu b8:")) == 1  # one legend


ROW = re.compile(r"^[* ] +(?:[\d,]+|failed|invalid) ")


@pytest.mark.parametrize("width", range(30, 61, 3))
def test_prose_wraps_between_words_and_keeps_configs_whole(width):
    from auturi.cli.render import say

    text = ("Reusing the cached choice from /home/someone/.cache/auturi/0123456789abcdef.json (16x16 d16 "
            "p16@cuda:0 b8, 14,759 steps/s then): measured first; --no-cache measures afresh, 2x8 d2 p1@cpu b8")
    buf = io.StringIO()
    say(Console(file=buf, width=width, force_terminal=False), text, "  ", "    ")
    lines = buf.getvalue().splitlines()
    assert " ".join(" ".join(lines).split()) == text  # every word, in order, none cut
    for line in lines:
        assert len(line) <= width or "/" in line, line  # only the path is longer than the narrowest lines
    assert sum(len(COMPACT.findall(line)) for line in lines) == 2, lines  # both configs whole on a line


def table_lines(text: str) -> list[str]:
    """The trials table's body rows."""
    return [ln for ln in text.splitlines() if ROW.match(ln) and COMPACT.search(ln)]


def test_one_row_per_config_with_its_last_figure():
    """The issue's table showed one config at 16,333 [3,191, 46,212], 26,429 and 51,458: now
    one row, with the figure of its confirm rounds, the choice on top."""
    result = made_up(cached=True)
    rows = table_lines(render(result))
    configs = [COMPACT.search(r).group(0) for r in rows]
    assert len(configs) == len(set(configs)) == 4, rows
    top = rows[0].split()
    assert top[0] == "*" and top[1] == "25,000" and top[2] == "24,000-26,500" and top[3] == "3", rows[0]
    assert "confirm" in rows[0] and "cache" in rows[0]  # the figure's stage, and its role besides
    for gone in ("16,333", "26,429", "51,458", "3,191", "46,212"):
        assert gone not in "\n".join(rows)
    assert [r.trial.source for r in config_rows(result)] == ["confirm", "confirm", "search", "search"]
    failed = next(r for r in rows if "4x4 d1 p1@cpu b4" in r)
    assert failed.split()[0] == "failed"


def test_a_choice_within_the_noise_of_the_start_is_flagged():
    noisy = render(made_up(noisy=True))
    flat = " ".join(noisy.split())
    assert "No layout is clearly faster than yours (the start, 1x16 d1 p1@cpu b16)" in flat
    assert "24,000-26,500 reaches the start's 21,000-26,000" in flat and "--budget-seconds" in flat
    assert noise_line(made_up(noisy=False)) is None  # 30,000-32,000 lies above 21,000-26,000
    same = made_up()
    same.choice = same.start
    assert noise_line(same) is None  # the start itself was chosen: nothing to doubt
    assert "clearly faster" not in render(made_up(noisy=False))


def test_a_cached_start_is_said_plainly():
    text = " ".join(render(made_up(cached=True), cached_from="/c/abc.json").split())
    assert "Cache: this run started from the choice cached in /c/abc.json (auturi tune --no-cache" in text
    shown = " ".join(render(made_up(cached=True)).split())  # auturi show: the file is not known
    assert "this run started from a cached choice" in shown
    assert "Cache:" not in render(made_up(cached=False))


def test_wide_terminals_also_show_the_predictions():
    wide = render(made_up(), width=120)
    assert "predicted" in wide and "19,000" in wide
    assert "predicted" not in render(made_up())


def test_tune_help_reads_at_80_columns(monkeypatch, capsys):
    """Plain click help (rich's panels left ~20 columns for descriptions and cut names):
    every option whole on its line, no type placeholders, every table word explained."""
    import typer

    from auturi.cli import NOTES, SOURCES
    from auturi.cli.app import app

    monkeypatch.setenv("COLUMNS", "80")
    command = typer.main.get_command(app)
    for args in (["tune", "--help"], ["--help"], ["show", "--help"]):
        assert command.main(args=args, prog_name="auturi", standalone_mode=False) == 0
        text = capsys.readouterr().out
        assert text.strip(), args
        for line in text.splitlines():
            assert len(line) <= 80, (args, line)
        assert "…" not in text and "<bool>" not in text and "<str>" not in text.split("Options:")[-1], args
        assert not re.search(r"--[\w-]*-\s*$", text, re.MULTILINE), args  # no option name broken at a hyphen
    tune = command.commands["tune"]
    names = [o for p in tune.params for o in list(p.opts) + list(p.secondary_opts) if o.startswith("-")]
    assert len(names) > 20
    command.main(args=["tune", "--help"], prog_name="auturi", standalone_mode=False)
    text = capsys.readouterr().out
    for name in names:
        assert re.search(rf"(^|[\s,/]){re.escape(name)}($|[\s,])", text, re.MULTILINE), name
    assert len(text.splitlines()) < 80  # it was 147 lines
    flat = " ".join(text.split())
    for word in list(NOTES) + list(SOURCES):
        assert f"{word}: " in flat, word
    assert "2x8 d2 p1@cpu b8" in flat


def test_the_status_page_linger_and_its_end_message(monkeypatch):
    """Not in a terminal (tests, pipes, jobs), the page stops with the run and the last line
    says where its final state is kept; in a terminal it stays up until Ctrl-C."""
    from auturi.cli import statuspage

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)
    monkeypatch.setattr(statuspage, "interactive", lambda: False)
    statuspage.linger("http://127.0.0.1:8123/", None, "/tmp/run/result.json", console)
    said = " ".join(out.getvalue().split())
    assert "The status page at http://127.0.0.1:8123/ stopped with the run" in said
    assert "the record /tmp/run/result.json (auturi show /tmp/run/result.json)" in said
    assert "--status-linger" in said
    for line in out.getvalue().splitlines():
        assert len(line) <= 80

    out.seek(0), out.truncate()
    statuspage.linger("http://127.0.0.1:8123/", None, None, console)
    assert "--out PATH" in " ".join(out.getvalue().split())

    slept: list[float] = []

    def ctrl_c(seconds: float) -> None:  # the user's Ctrl-C, on the first sleep
        slept.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(statuspage, "interactive", lambda: True)
    monkeypatch.setattr(statuspage.time, "sleep", ctrl_c)
    out.seek(0), out.truncate()
    statuspage.linger("http://127.0.0.1:8123/", None, "/tmp/r.json", console)  # returns on Ctrl-C
    assert "stays up at http://127.0.0.1:8123/ until Ctrl-C" in " ".join(out.getvalue().split())
    assert slept == [3600.0]  # sleeps (no polling) until the signal
    slept.clear()
    out.seek(0), out.truncate()
    statuspage.linger("http://127.0.0.1:8123/", 0.0, "/tmp/r.json", console)  # --status-linger 0 wins
    assert slept == [] and "stopped with the run" in out.getvalue()


def test_progress_fits_80_columns():
    from types import SimpleNamespace

    from auturi.cli.render import make_progress, progress_fields

    status = {"phase": "search", "trials": 11, "budget_trials": None, "space": {"configs": 57},
              "budget_seconds": 15.0, "budget_seconds_left": 7.2, "current_config": LONGEST.to_dict(),
              "best_throughput": 123_456.0}
    fields = progress_fields(SimpleNamespace(status=status))
    assert fields["description"] == "search    trial 12 of at most 57, 7 s left  16x16 d16 p16@cuda:0 b8"
    buf = io.StringIO()
    progress = make_progress(Console(file=buf, width=80, force_terminal=True, color_system=None))
    task = progress.add_task("", total=1000, best="-", best_short="")
    progress.update(task, **fields)
    rec = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    rec.print(progress.get_renderable())
    shown = rec.export_text().splitlines()
    assert len([ln for ln in shown if ln.strip()]) == 1 and "best 123,456" in shown[0], shown
