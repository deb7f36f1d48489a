"""The ``auturi`` commands (typer): ``tune`` (built on :func:`auturi.tune`), ``show`` and
``bench``, and how their errors become exit codes.

Exit codes: 0 done, 1 tuning failed at run time (a worker died), 2 bad input (unknown env,
bad budget, missing GPU, unreadable file; one line says what to change), 130 interrupted
(Ctrl-C), 143 terminated (SIGTERM). An interrupted ``tune`` stops every worker, says what it
was doing and writes what it measured as a partial record (``--out``, else the cache
directory).

Over 400 lines because ``tune``'s options, their checks and its report (with ``--backend ray``,
where the actors ran) read best in one place; parsing lives in ``knobs``, rendering in ``render``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from auturi.cli.caching import StoreAfterOut, cache_notice, cache_warnings_as_lines
from auturi.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, CliError, fail, one_line, stderr, stdout
from auturi.cli.helptext import HelpCommand, HelpGroup
from auturi.cli.interrupt import (EXIT_TERMINATED, Interrupted, Terminated, interrupted, sigterm_as_interrupt,
                                  signal_words)
from auturi.cli.knobs import executor_kwargs, parse_devices, parse_start
from auturi.cli.policies import build_policy, env_note, probe_spaces, resolve_env_spec
from auturi.cli.statuspage import StatusPage, linger
from auturi.tuner.api import DEFAULT_BUDGET_SECONDS
from auturi.cli.render import (ProgressFeed, compact, config_line, fmt, json_safe, make_progress, notes_help,
                               print_result, say)

__all__ = ["app", "main"]

# Defaults sized so that `auturi tune CartPole-v1` ends in well under a minute on 2 cores.
DEFAULT_NUM_ENVS = 8
DEFAULT_NUM_STEPS = 64
DEFAULT_MAX_TRIAL_SECONDS = 4.0
DEFAULT_TOP_K = 2
DEFAULT_FINAL_ROUNDS = (1, 2)
MAX_COUNT = 2**31 - 1  # --num-envs, --num-steps: far above any real run; 10**20 failed deep in a trial (OverflowError)


class Strategy(str, Enum):
    model = "model"
    grid = "grid"
    optuna = "optuna"


class Backend(str, Enum):
    shm = "shm"
    serial = "serial"
    ray = "ray"


# rich_markup_mode=None: click's plain --help, which reads at 80 columns (see helptext)
app = typer.Typer(
    name="auturi", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, cls=HelpGroup,
    help="Find, by measurement, the fastest parallel layout for RL experience collection.")


def _version(value: bool) -> None:
    if value:
        from auturi import __version__

        print(f"auturi {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Find, by measurement, the fastest parallel layout for RL experience collection."""


# ---------------------------------------------------------------------------- commands
Opt = typer.Option


# Metavars are spelled out (typer's default "<str>"/"TEXT" differs between releases and says
# less); help lines are short: the details are in docs/cli.md.
@app.command(cls=HelpCommand, epilog=notes_help(), short_help="Measure layouts for ENV; print the fastest.")
def tune(
    env: Annotated[str, typer.Argument(metavar="ENV", help="A gymnasium id (CartPole-v1; ALE/Pong-v5 gets "
                                                           "the standard preprocessing), a C++ vector env id "
                                                           "(envpool:Pong-v5, ale:pong), or module:factory (returns a "
                                                           "gymnasium.Env).", show_default=False)],
    policy: Annotated[str, Opt("--policy", metavar="KIND", help="mlp, cnn, auto (cnn for 84x84 frames, else mlp), "
                                                                "or PATH.zip: a saved SB3 PPO/A2C model.")] = "auto",
    raw_frames: Annotated[bool, Opt("--raw-frames", help="Atari ids: the raw 210x160 RGB frames.")] = False,
    num_envs: Annotated[int, Opt("--num-envs", metavar="N", help="Total envs (the search keeps it).")
                        ] = DEFAULT_NUM_ENVS,
    num_steps: Annotated[int, Opt("--num-steps", metavar="T", help="Steps per env per collect: your "
                                                                   "rollout length.")] = DEFAULT_NUM_STEPS,
    strategy: Annotated[Strategy, Opt("--strategy", metavar="model|grid|optuna",
                                      help="model: profile, predict, measure the promising; grid: all; "
                                           "optuna.")] = Strategy.model,
    budget_trials: Annotated[int | None, Opt("--budget-trials", metavar="N",
                                             help="Most configs to measure, baselines included.")] = None,
    budget_seconds: Annotated[float | None, Opt("--budget-seconds", metavar="S",
                                                help=f"Wall seconds for the whole tuning (default "
                                                     f"{DEFAULT_BUDGET_SECONDS:g} when no budget is given).")] = None,
    devices: Annotated[str | None, Opt("--devices", metavar="LIST", help="Policy devices to try: cpu, cuda or "
                                                                         "cpu,cuda (default: cpu, and cuda when "
                                                                         "present).")] = None,
    start: Annotated[str | None, Opt("--start", metavar="KNOB=V,...",
                                     help="Your current layout, measured as a baseline, e.g. num_actors=2,"
                                          "env_parallel_degree=2 (default: serial).")] = None,
    seed: Annotated[int, Opt("--seed", metavar="S", help="Env i gets seed S+i; seeds the strategy too.")] = 0,
    out: Annotated[Path | None, Opt("--out", "-o", metavar="PATH", help="Write the JSON results record here.")
                   ] = None,
    status_port: Annotated[int | None, Opt("--status-port", metavar="PORT",
                                           help="Serve the status page and API while tuning (0: any free "
                                                "port).")] = None,
    status_host: Annotated[str, Opt("--status-host", metavar="HOST", help="The status server's address; not "
                                                                          "loopback needs a token.")
                           ] = "127.0.0.1",
    status_token: Annotated[str | None, Opt("--status-token", metavar="TOKEN", envvar="AUTURI_STATUS_TOKEN",
                                            help="Token the status server requires (Bearer header or "
                                                 "?token=).", show_envvar=True)] = None,
    status_linger: Annotated[float | None, Opt("--status-linger", metavar="S",
                                               help="Seconds to keep serving the final page once tuning ends "
                                                    "(inf: until Ctrl-C; default: until Ctrl-C in a terminal, "
                                                    "else 0).", show_default=False)] = None,
    json_out: Annotated[bool, Opt("--json", help="Print only the JSON record on stdout.")] = False,
    backend: Annotated[Backend, Opt("--backend", metavar="shm|serial|ray",
                                    help="shm: processes and shared memory; serial: all in this process; "
                                         "ray: one Ray actor per actor (see --address).")] = Backend.shm,
    address: Annotated[str | None, Opt("--address", metavar="ADDR",
                                       help="The Ray cluster for --backend ray: auto, HOST:6379 or "
                                            "ray://HOST:10001 (default: $RAY_ADDRESS, else a local Ray).")] = None,
    worker_timeout: Annotated[float | None, Opt("--worker-timeout", metavar="S",
                                                help="A worker that makes no progress this long fails the trial, "
                                                     "named (default: $AUTURI_WORKER_TIMEOUT, else 60; inf: "
                                                     "never).")] = None,
    max_trial_seconds: Annotated[float, Opt("--max-trial-seconds", metavar="S",
                                            help="Cap on one trial's measuring time.")] = DEFAULT_MAX_TRIAL_SECONDS,
    cache: Annotated[bool, Opt("--cache/--no-cache", help="Start from, and store into, the results cache "
                                                          "($AUTURI_CACHE_DIR, else ~/.cache/auturi).")] = True,
    debug: Annotated[bool, Opt("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Measure collection layouts for ENV on this machine and print the fastest."""
    _run(lambda: _tune_guarded(
        env=env, raw_frames=raw_frames, policy=policy, num_envs=num_envs, num_steps=num_steps,
        strategy=strategy.value,
        budget_trials=budget_trials, budget_seconds=budget_seconds, devices=devices, start=start, seed=seed, out=out,
        status_port=status_port, status_host=status_host, status_token=status_token, status_linger=status_linger,
        json_out=json_out, backend=backend.value, max_trial_seconds=max_trial_seconds, cache=cache,
        executor_kwargs=executor_kwargs(backend.value, address, worker_timeout)), debug)


@app.command(cls=HelpCommand, short_help="Print a saved result again.")
def show(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="A results record (auturi tune --out, or a cache "
                                                              "file).", show_default=False)],
    json_out: Annotated[bool, Opt("--json", help="Print the choice as JSON.")] = False,
    debug: Annotated[bool, Opt("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Print a saved result: the trials table and the choice as an auturi.Config(...) line."""
    _run(lambda: _show(path, json_out), debug)


@app.command(cls=HelpCommand, short_help="Run the benchmark suite (source checkout).",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def bench(ctx: typer.Context) -> None:
    """Run the benchmark suite of a source checkout (python -m bench); see auturi bench --help."""
    _run(lambda: _bench(list(ctx.args)), debug=True)  # a benchmark crash shows its traceback


def _bench(args: list[str]) -> None:
    """Run ``python -m bench ARGS`` in the checkout this ``auturi`` package lives in (an
    editable install) or, failing that, in the current directory: the benchmarks are the
    repository's ``bench/`` package, which pip does not install (a child process, so the
    package never imports the repository's code)."""
    import subprocess

    here = Path(__file__).resolve().parents
    root = next((p for p in (*here, Path.cwd()) if (p / "bench" / "suite.py").is_file()), None)
    if root is None:
        fail("auturi bench needs a source checkout: the benchmarks are the repository's bench/ package, which "
             "pip does not install. Clone the Auturi repository, pip install -e '.[dev]' there, and run "
             "auturi bench (or python -m bench) from its root")
    code = subprocess.call([sys.executable, "-m", "bench", *args], cwd=root)
    if code:
        raise typer.Exit(code)


def _run(fn: Callable[[], None], debug: bool) -> None:
    err = stderr()
    try:
        fn()
    except Interrupted as e:
        err.print(f"auturi: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(e.code) from None
    except CliError as e:
        err.print(f"auturi: error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(e.code) from None
    except KeyboardInterrupt as e:
        err.print(f"auturi: {signal_words(e)}; every worker was stopped", markup=False)
        raise typer.Exit(EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED) from None
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - no traceback for users unless --debug
        if debug:
            traceback.print_exc()
        from auturi.errors import WorkerError

        hint = "" if debug else " (run with --debug for the traceback)"
        if (isinstance(e, WorkerError) or type(e).__name__ == "TuneError") and not getattr(e, "env_fails", False):
            hint += "; to find which layout fails, try --backend serial or --strategy grid"
        err.print(f"auturi: error: {type(e).__name__}: {one_line(str(e), 2)}{hint}", markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None


def _check_tune_options(*, num_envs: int, num_steps: int, budget_trials: int | None, budget_seconds: float | None,
                        max_trial_seconds: float, status_port: int | None, status_host: str,
                        status_token: str | None, status_linger: float | None, strategy: str, seed: int = 0) -> None:
    """The options' rules in the CLI's words, before any heavy import (a typo costs nothing)."""
    if num_envs < 1:
        fail(f"--num-envs must be >= 1, got {num_envs}")
    if num_steps < 1:
        fail(f"--num-steps must be >= 1, got {num_steps}")
    for name, value in (("--num-envs", num_envs), ("--num-steps", num_steps)):
        if value > MAX_COUNT:  # a few digits too many: one line here, not an OverflowError inside a trial
            fail(f"{name} must be <= {MAX_COUNT:,}, got {value:,}")
    if seed < 0:  # gymnasium refuses negative seeds, in a worker, as a run-time failure
        fail(f"--seed must be >= 0 (env i is seeded seed + i), got {seed}")
    if budget_trials is not None and budget_trials < 1:
        fail(f"--budget-trials must be >= 1, got {budget_trials} (leave it out for the strategy's own stop)")
    if budget_seconds is not None and not (budget_seconds > 0 and math.isfinite(budget_seconds)):
        fail(f"--budget-seconds must be > 0 and finite, got {budget_seconds:g} (leave it out for "
             f"the default {DEFAULT_BUDGET_SECONDS:g} s, or bound the run with --budget-trials N)")
    if not (max_trial_seconds > 0 and math.isfinite(max_trial_seconds)):
        fail(f"--max-trial-seconds must be > 0 and finite, got {max_trial_seconds:g}")
    if status_port is not None and not 0 <= status_port <= 65535:
        fail(f"--status-port must be in 0..65535 (0: any free port), got {status_port}")
    if status_linger is not None and not status_linger >= 0:
        fail(f"--status-linger must be >= 0 seconds (inf: until Ctrl-C), got {status_linger:g}")
    if strategy == "optuna" and importlib.util.find_spec("optuna") is None:
        fail("--strategy optuna needs Optuna: pip install optuna (or 'auturi[tune]'), or use --strategy model")
    if status_port is not None:
        if importlib.util.find_spec("fastapi") is None:
            fail("--status-port needs FastAPI and uvicorn: pip install 'auturi[server]'")
        from auturi.server import is_loopback

        if not is_loopback(status_host) and not status_token:
            fail(f"--status-host {status_host} is not loopback: pass --status-token TOKEN (or set "
                 f"AUTURI_STATUS_TOKEN) so only you can read it, or leave --status-host at 127.0.0.1")


def _check_out(out: Path, out_path: Path) -> None:
    """Whether ``--out`` can be written, before tuning rather than after it: a directory given
    as the file, a missing directory, or one that cannot take a new file. The last is tried
    (a file made and removed), since ``os.access`` says yes to root, also where the file system
    refuses (``/proc``) or is read-only for everyone."""
    import tempfile

    if out_path.is_dir():
        fail(f"--out {out} is a directory; pass a file path, e.g. --out {out_path / 'result.json'}")
    parent = out_path.parent
    if not parent.exists():
        fail(f"--out {out}: directory {parent} does not exist")
    if not parent.is_dir():
        fail(f"--out {out}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".auturi-out-probe-")
    except OSError as e:
        fail(f"--out {out}: directory {parent} cannot take a new file ({e.strerror or e}); pick a path you can "
             f"write")
    os.close(fd)
    os.unlink(probe)


def _connect_ray(address: str | None) -> None:
    """``--backend ray`` with a cluster address (``--address`` or ``$RAY_ADDRESS``): connect
    now, so an address nobody listens on is one line in the CLI's words (no pointer to
    ``--debug``) before the env and the policy are built. The executor then finds this
    connection. A local instance (no address) is left to the executor, which starts and ends it."""
    if not (address or os.environ.get("RAY_ADDRESS")):
        return
    from auturi.errors import AuturiError
    from auturi.executor.ray.cluster import connect

    try:
        connect(address)
    except AuturiError as e:
        # Exit 1, as before this check moved here (tests/test_cli.py pins it): the cluster is
        # the machine's state at run time, not a typo in the command.
        fail(one_line(str(e)).replace("pass address=None (and unset RAY_ADDRESS)",
                                      "leave out --address (and unset RAY_ADDRESS)"), EXIT_FAILED)


def _tune_guarded(**kw: Any) -> None:
    with sigterm_as_interrupt(), cache_warnings_as_lines():
        _tune(**kw)


def _tune(*, env: str, raw_frames: bool, policy: str, num_envs: int, num_steps: int, strategy: str,
          budget_trials: int | None, budget_seconds: float | None, devices: str | None, start: str | None,
          seed: int, out: Path | None, status_port: int | None, status_host: str, status_token: str | None,
          status_linger: float | None, json_out: bool, backend: str, max_trial_seconds: float, cache: bool,
          executor_kwargs: dict[str, Any]) -> None:
    _check_tune_options(num_envs=num_envs, num_steps=num_steps, seed=seed, budget_trials=budget_trials,
                        budget_seconds=budget_seconds, max_trial_seconds=max_trial_seconds, status_port=status_port,
                        status_host=status_host, status_token=status_token, status_linger=status_linger,
                        strategy=strategy)
    if budget_trials is None and budget_seconds is None:
        budget_seconds = DEFAULT_BUDGET_SECONDS
    start_config = parse_start(start, num_envs) if start is not None else None
    if backend == "ray":
        _connect_ray(executor_kwargs.get("address"))
    env_obj = resolve_env_spec(env, raw_frames)
    dev_list = parse_devices(devices)
    if start_config is not None and start_config.policy_device != "cpu":
        dev = start_config.policy_device
        parse_devices(dev, f"--start policy_device={dev}")  # the same check for a missing GPU
    out_path = out.expanduser() if out is not None else None
    if out_path is not None:
        _check_out(out, out_path)
    pol, pol_desc = build_policy(policy, *probe_spaces(env_obj))

    from auturi.errors import ConfigError
    from auturi.tuner.api import tune as tune_api

    err, out_console = stderr(), stdout()
    progress = None if json_out else make_progress(err)
    page = StatusPage(status_host, status_port, status_token or None, env=str(env)) if status_port is not None else None
    feed = ProgressFeed(progress, page.snapshot if page is not None else None)
    if not json_out:
        say(err, f"Tuning {env} x {num_envs} envs, {num_steps} steps/collect, policy {pol_desc}, "
                 f"backend {backend}, strategy {strategy}, budget "
                 + ", ".join(x for x in (f"{budget_trials} trials" if budget_trials else "",
                                         f"{budget_seconds:g} s" if budget_seconds else "") if x))
        if env_note(env_obj):
            say(err, env_note(env_obj))

    places: dict[str, list] = {}  # config -> where its actors ran (ray backend), for the report and the page

    def on_event(event: Any) -> None:
        if "cache_from" not in held and held.get("tuner") is not None and held["tuner"].t0 is not None:
            held["cache_from"] = cache_notice(held["tuner"], None if json_out else (progress.console if progress
                                                                                      is not None else err))
        feed(event)
        got = getattr(places.get("executor"), "actor_places", None)
        if got:
            places[str(places["executor"].config)] = got
            if page is not None:
                page.snapshot.set_placement(got)

    held: dict[str, Any] = {}  # the tuner (for a partial record); its cache, held back until --out is written

    def on_start(tuner: Any, executor: Any) -> None:
        places["executor"] = executor
        held["tuner"] = tuner
        if tuner.cache is not None:
            tuner.cache = held["cache"] = StoreAfterOut(tuner.cache)
        if page is not None:
            page.attach(tuner)
        tuner.startup_seconds = _process_seconds()
        if progress is not None:
            progress.start()

    try:
        if page is not None:  # bound before any worker starts: a port in use fails at once
            url = page.bind()
            err.print(f"Status: {url}" + ("  (token required)" if status_token else ""), markup=False)
        try:
            result = tune_api(env_obj, policy=pol, num_envs=num_envs, num_steps=num_steps,
                              budget_seconds=budget_seconds, budget_trials=budget_trials, strategy=strategy,
                              backend=backend, start=start_config, devices=dev_list, seed=seed, cache=cache,
                              max_trial_seconds=max_trial_seconds, top_k=DEFAULT_TOP_K,
                              final_rounds=DEFAULT_FINAL_ROUNDS, callback=on_event, on_start=on_start,
                              **executor_kwargs)
        except ConfigError as e:
            fail(str(e))
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the executor has stopped its workers
            if progress is not None:
                progress.stop()
            from auturi import Config

            raise interrupted(e, held.get("tuner"), start_config or Config.serial(num_envs), num_steps, out_path,
                              out) from None
        finally:
            if progress is not None:
                progress.stop()
        if page is not None:
            page.final()
        record = _report(result, out_path, json_out, cache, page, err, out_console, places.get(str(result.choice)),
                         held.get("cache"), held.get("cache_from"))
        if page is not None and page.server is not None:
            linger(page.server.url, status_linger, record, err)
    finally:
        if page is not None:
            page.stop()


def _report(result: Any, out_path: Path | None, json_out: bool, cache: bool, page: Any, err: Any,
            out_console: Any, places: list | None = None, held: Any = None,
            cached_from: Path | None = None) -> Path | None:
    """The record to --out, then into the cache (a cache that fails is a warning; --out is
    written first so nothing the user asked for waits on it), then the JSON or the tables
    (with ``--backend ray``, where the choice's actors ran). Returns where the record is
    (--out, else the cache file, else None); ``cached_from``: the cache record the run
    started from, which the report names."""
    saved, out_error = None, None
    if out_path is not None:
        try:
            saved = result.save(out_path)
        except OSError as e:  # the tables still print (the work is not lost), then exit 1
            out_error = e
    cached = held.flush() if held is not None else None
    if json_out:
        rec = result.to_record()
        if places:
            rec["actors"] = places
        if page is not None and page.server is not None:
            rec["status_url"] = page.server.url
        out_console.file.write(json.dumps(json_safe(rec), indent=1, allow_nan=False) + "\n")
        out_console.file.flush()
    else:
        print_result(out_console, result, saved, cached_from)
        if places:
            from auturi.executor.ray.cluster import place_lines

            nodes = len({p["node"] for p in places})
            out_console.print(f"Where its actors ran ({nodes} node{'' if nodes == 1 else 's'}):", markup=False)
            for line in place_lines(places):
                say(out_console, line, "  ", "    ")
        if saved is None and out_error is None and cache and cached is not None:
            say(err, f"Record cached at {cached} (write one with --out result.json)")
    if out_error is not None:
        fail(f"--out {out_path}: cannot write it ({out_error.strerror or out_error}); the results are printed "
             f"above{' and cached' if cached is not None else ''}; pick a path you can write", EXIT_FAILED)
    return saved if saved is not None else cached


def _process_seconds() -> float | None:
    """Seconds since this process started (Linux; None elsewhere): the start-up cost."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(after_name[19])  # field 22, starttime, in clock ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _show(path: Path, json_out: bool) -> None:
    from auturi.tuner.api import TuneReport as TuneResult  # reads a record's "explain" too

    p = path.expanduser()
    if p.is_dir():
        fail(f"{path} is a directory; pass a results file in it (auturi tune ENV --out FILE, or a cache file "
             f"*.json)")
    if p.exists() and not p.is_file():
        fail(f"{path} is not a regular file; pass a results record written by auturi tune --out")
    if not p.is_file():
        fail(f"{path}: no such file; write one with auturi tune ENV --out {path}")
    try:
        result = TuneResult.load(p)
    except json.JSONDecodeError as e:
        fail(f"{path}: not JSON ({e.msg} at line {e.lineno}); pass a file written by auturi tune --out")
    except (KeyError, TypeError, ValueError) as e:
        fail(f"{path}: not an Auturi results record ({type(e).__name__}: {one_line(str(e))}); pass a file "
              f"written by auturi tune --out")
    except OSError as e:
        fail(f"{path}: cannot read it ({e.strerror})")
    out = stdout()
    if json_out:
        rec = {"choice": result.choice.to_dict(), "config_line": config_line(result.choice),
               "throughput": result.throughput, "why": result.reason}
        out.file.write(json.dumps(json_safe(rec), indent=1) + "\n")
        return
    wl = result.workload or {}
    hw = result.hardware or {}
    say(out, f"{p}: {wl.get('env', '?')} x {wl.get('num_envs', '?')} envs, {result.num_steps} steps/collect, "
             f"on {hw.get('cpu_model', '?')} ({hw.get('cores', '?')} cores"
             + (f", {', '.join(hw['gpus'])}" if hw.get("gpus") else "") + ")")
    stop = _interruption_of(p)
    if stop:
        say(out, f"Partial record: the run was {stop}; the choice below is the fastest config measured so far, "
                 f"not re-measured or confirmed")
    print_result(out, result)


def _interruption_of(path: Path) -> str:
    """"interrupted by SIGTERM during the search phase" for a partial record, else ""."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    info = rec.get("interrupted") if isinstance(rec, dict) else None
    if not isinstance(info, dict):
        return ""
    return f"interrupted by {info.get('signal', '?')} during the {info.get('phase', '?')} phase"



def main(argv: list[str] | None = None) -> None:
    """The console script ``auturi``. Usage errors (a bad option value, a missing argument)
    are one line on stderr and exit 2, like every other input error."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="auturi", standalone_mode=False)
    except KeyboardInterrupt:
        from auturi.cli.starting import interrupted_while_starting

        interrupted_while_starting()
    except Exception as e:
        if type(e).__name__ == "Abort" and isinstance(e.__context__, KeyboardInterrupt):
            from auturi.cli.starting import interrupted_while_starting  # click's wrapping of a Ctrl-C while parsing

            interrupted_while_starting()
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())
            sys.exit(EXIT_USAGE)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        stderr().print(f"auturi: error: {one_line(e.format_message())}{where}", markup=False, soft_wrap=True)
        sys.exit(e.exit_code if isinstance(e.exit_code, int) and e.exit_code else EXIT_USAGE)
    sys.exit(code if isinstance(code, int) else 0)
