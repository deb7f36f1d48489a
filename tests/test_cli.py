"""``auturi tune`` and ``auturi show`` through the real entry point (``python -m auturi.cli``,
the module the ``auturi`` console script runs), in subprocesses, on tiny budgets."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from auturi import Config

pytest.importorskip("typer")
pytest.importorskip("rich")

# The first test reading side_runs waits for all of them (~35 s of the 2 cores, more on a busy
# machine): a longer limit than the suite's 120 s, which each process's own 120 s bounds anyway.
pytestmark = pytest.mark.timeout(300)

CONFIG_LINE = re.compile(r"^auturi\.Config\(((?:[^()\n]*,\n)*[^()\n]*)\)$", re.MULTILINE)  # may go on over lines
COMPACT = re.compile(r"\b\d+x\d+ d\d+ p\d+@(?:cpu|cuda(?::\d+)?) b\d+\b")  # 2x4 d1 p1@cpu b4
TINY = ["--backend", "serial", "--budget-trials", "3", "--num-envs", "4", "--num-steps", "16",
        "--max-trial-seconds", "1"]


def cli_env(tmp: Path, columns: int = 200) -> dict[str, str]:
    env = dict(os.environ, COLUMNS=str(columns), AUTURI_CACHE_DIR=str(tmp / "cache"), PYTHONWARNINGS="ignore")
    env.pop("AUTURI_STATUS_TOKEN", None)
    return env


def cli(*args: str, tmp: Path, timeout: float = 120, columns: int = 200, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "auturi.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(tmp, columns), check=False, **kw)


def parse_config_line(text: str) -> Config:
    """The ``auturi.Config(...)`` line (continued over lines when it is long), parsed without eval."""
    m = CONFIG_LINE.search(text)
    assert m, f"no auturi.Config(...) line in:\n{text}"
    call = ast.parse(m.group(0), mode="eval").body
    assert isinstance(call, ast.Call) and not call.args
    return Config(**{k.arg: ast.literal_eval(k.value) for k in call.keywords})


def _side_commands(tmp: Path) -> dict[str, tuple[list[str], dict[str, str], dict]]:
    """The runs of the tests that need nothing but their own process (and no worker process:
    the serial backend, or a run that fails before any starts), by name: (argv, environment,
    further ``subprocess.run`` arguments). Each has a folder of its own under ``tmp``; those of
    AFTER_TUNED read the record and the cache "tuned" wrote there."""
    auturi_cli = [sys.executable, "-m", "auturi.cli"]
    tune = [*auturi_cli, "tune"]
    for folder in ("policy", "unwritable", "help", "version", "no_typer", "bad_input", "timeout"):
        (tmp / folder).mkdir()
    model = tmp / "policy" / "ppo_cartpole.zip"
    unwritable = tmp / "unwritable"
    (unwritable / "a_file").write_text("")
    no_typer = ("import sys; sys.modules['typer'] = None; sys.argv = ['auturi', '--help']; "
                "from auturi.cli import main; main()")
    # test_worker_timeout_and_address_reach_the_executor's runs: an AUTURI_WORKER_TIMEOUT the
    # executor would refuse, and no RAY_ADDRESS
    timeout_env = dict(cli_env(tmp / "timeout"), AUTURI_WORKER_TIMEOUT="never")
    timeout_env.pop("RAY_ADDRESS", None)
    no_ray = ("import runpy, sys; sys.modules['ray'] = None; "  # import ray fails, as when not installed
              "sys.argv = ['auturi', 'tune', 'CartPole-v1', '--backend', 'ray']; "
              "runpy.run_module('auturi.cli', run_name='__main__')")
    page = importlib.util.find_spec("fastapi") is not None  # the status server is the [server] extra
    return {
        "tuned": ([*tune, "CartPole-v1", *TINY, "--out", str(tmp / "result.json")], cli_env(tmp, 80), {}),
        "policy_ok": ([*tune, "CartPole-v1", "--policy", str(model), "--backend", "serial", "--budget-trials", "2",
                       "--num-envs", "2", "--num-steps", "8", "--max-trial-seconds", "1", "--budget-seconds", "1",
                       "--no-cache", "--json"], cli_env(tmp / "policy"), {}),
        "policy_wrong": ([*tune, "Acrobot-v1", "--policy", str(model), "--num-envs", "2"], cli_env(tmp / "policy"),
                         {}),
        # the cache directory lies under a regular file, so it cannot be made even by root
        "unwritable": ([*tune, "CartPole-v1", *TINY[:2], "--budget-trials", "2", "--num-envs", "2", "--num-steps",
                        "8", "--max-trial-seconds", "0.5", "--budget-seconds", "1", "--out",
                        str(unwritable / "result.json")],
                       dict(cli_env(unwritable), AUTURI_CACHE_DIR=str(unwritable / "a_file" / "cache")), {}),
        "help": ([*tune, "--help"], cli_env(tmp / "help", 80), {}),
        "version": ([*auturi_cli, "--version"], cli_env(tmp / "version"), {}),
        "no_typer": ([sys.executable, "-c", no_typer], cli_env(tmp / "no_typer"), {}),
        "bad_input": ([sys.executable, "-c", ENTRY_POINT_RUNS], cli_env(tmp / "bad_input"),
                      {"input": json.dumps([args for args, _ in _errors_case(tmp / "bad_input")])}),
        "timeout_bad_env": ([*tune, "CartPole-v1", *TINY[:2], "--budget-trials", "1"], timeout_env, {}),
        # one trial: what is checked is that the run starts and ends, not what it chooses
        "timeout_ok": ([*tune, "CartPole-v1", *TINY[:2], "--budget-trials", "1", "--num-envs", "4", "--num-steps",
                        "16", "--max-trial-seconds", "0.5", "--worker-timeout", "30"], timeout_env, {}),
        "no_ray": ([sys.executable, "-c", no_ray], timeout_env, {}),
        "ray_far": ([*tune, "CartPole-v1", "--backend", "ray", "--address", "127.0.0.1:1", "--worker-timeout", "30"],
                    timeout_env, {}),
        # AFTER_TUNED
        "show": ([*auturi_cli, "show", str(tmp / "result.json")], cli_env(tmp), {}),
        "show_json": ([*auturi_cli, "show", str(tmp / "result.json"), "--json"], cli_env(tmp), {}),
        # --budget-seconds 1: what is asserted (the notices, cache_hit) does not depend on how long
        # the confirm rounds after the cached choice's measurement go on.
        "second": ([*tune, "CartPole-v1", *TINY, "--budget-seconds", "1", "--out", str(tmp / "second.json"),
                    *(["--status-port", "0"] if page else [])], cli_env(tmp, 80), {"stdin": subprocess.DEVNULL}),
    }


AFTER_TUNED = ("show", "show_json", "second")
"""The side runs that read what "tuned" wrote (its record, its cache): started once it ended."""

TIMEOUT_RUNS = ("timeout_bad_env", "timeout_ok", "no_ray", "ray_far")

_NEEDS = {"test_policy_from_a_saved_sb3_model": ("policy_ok", "policy_wrong"),
          "test_an_unwritable_cache_loses_nothing": ("unwritable",),
          "test_every_word_of_the_table_is_explained": ("help",),
          "test_tune_says_why_the_choice_wins": ("show",),
          "test_version": ("version",),
          "test_without_typer_the_entry_point_names_the_install": ("no_typer",),
          "test_show_prints_the_table_and_the_config_line": ("show", "show_json"),
          "test_a_second_run_says_it_reuses_the_cache_and_where_the_status_page_went": ("second",),
          "test_bad_input_exits_2_with_one_line_and_no_traceback": ("bad_input",),
          "test_worker_timeout_and_address_reach_the_executor": TIMEOUT_RUNS,
          "test_json_output_module_factory_shm_and_status_port": ("status_port",)}
"""The side runs a test reads besides ``tuned`` (which every test using that fixture reads)."""

SLOTS = 2
"""Side runs at a time. Each is mostly one core's work (Python importing torch, then a
serial-backend tune or less). They run in the background from the session's start (``early_run``),
beside the modules before this one, which mostly keep one core busy: 2 at a time fill the
other without crowding those modules' tests (4 at once kept both cores busy when the module
waited for them, 2026-11-27)."""


class SideRuns:
    """The side runs of the selected tests: ``runs[name]`` is that run's ``CompletedProcess``
    ("status_port": what ``_status_port_run`` saw), raising what the run raised (a timeout,
    say) in the test that reads it, not in every test of the module; ``runs.seconds(name)``
    its wall seconds; ``runs.tmp`` their folder; ``runs.cached_after_tuned`` the records in
    the cache once "tuned" ended, before any run of AFTER_TUNED started."""

    def __init__(self, futures: dict, tmp: Path, cached_after_tuned: list[Path]):
        self.futures, self.tmp, self.cached_after_tuned = futures, tmp, cached_after_tuned

    def __getitem__(self, name: str) -> subprocess.CompletedProcess:
        return self.futures[name].result()[0]

    def seconds(self, name: str) -> float:
        return self.futures[name].result()[1]


def _wanted(items) -> set[str]:
    """The side runs the tests of this module among ``items`` need."""
    items = [item for item in items if getattr(item, "module", None) is not None and item.module.__name__ == __name__]
    wanted = {"tuned"} if any("tuned" in item.fixturenames for item in items) else set()
    for item in items:
        wanted.update(_NEEDS.get(item.originalname, ()))
    if importlib.util.find_spec("stable_baselines3") is None:  # that test skips
        wanted -= {"policy_ok", "policy_wrong"}
    if importlib.util.find_spec("ray") is None:  # that test checks the error without Ray only
        wanted -= {"ray_far"}
    if any(importlib.util.find_spec(m) is None for m in ("httpx", "fastapi")):  # that test skips
        wanted -= {"status_port"}
    if wanted & set(AFTER_TUNED):
        wanted.add("tuned")
    return wanted


def _start_side_runs(wanted: set[str], tmp: Path):
    """The side runs ``wanted``, SLOTS at a time ("tuned" first, those of AFTER_TUNED once it
    ended), in the background (conftest's BackgroundThread, whose ``result()`` is the
    SideRuns once all ended). Their environments and working directory are fixed here, as
    the session starts: the tests that run meanwhile may change this process's."""
    from tests.conftest import BackgroundThread

    commands = {name: c for name, c in _side_commands(tmp).items() if name in wanted}
    if "policy_ok" in commands:
        from stable_baselines3 import PPO

        PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, seed=0, device="cpu").save(
            tmp / "policy" / "ppo_cartpole.zip")
    cwd, status_env = os.getcwd(), cli_env(tmp / "status_port")

    def run_all(bg) -> SideRuns:
        cached: list[Path] = []
        with ThreadPoolExecutor(SLOTS) as pool:
            futures = {}
            for name, (args, env, kw) in commands.items():  # "tuned" first: AFTER_TUNED wait for it
                if name not in AFTER_TUNED:
                    futures[name] = pool.submit(_timed_run, bg, args, dict(env), dict(kw, cwd=cwd))
                if name == "tuned" and "status_port" in wanted:  # the longest after it: started next
                    futures["status_port"] = pool.submit(_status_port_run, bg, tmp / "status_port", status_env)
            if "status_port" in wanted and "status_port" not in futures:
                futures["status_port"] = pool.submit(_status_port_run, bg, tmp / "status_port", status_env)
            later = [name for name in AFTER_TUNED if name in commands]
            if later:
                try:
                    futures["tuned"].result()
                except Exception:  # noqa: BLE001  (raised again in each test that reads "tuned")
                    pass
                cached = sorted((tmp / "cache").glob("*.json"))
                futures.update({name: pool.submit(_timed_run, bg, commands[name][0], dict(commands[name][1]),
                                                  dict(commands[name][2], cwd=cwd)) for name in later})
        return SideRuns(futures, tmp, cached)

    return BackgroundThread(run_all, "test_cli side runs")


def early_run(items, tmp_path_factory):
    """Called by conftest's ``_start_early_runs`` as the session starts: the side runs of the
    selected tests of this module (None if none needs one) go on beside the modules before
    this one (mostly one core's in-process work) instead of making this module wait ~25 s
    for them on 2 cores (2026-11-27)."""
    wanted = _wanted(items)
    return _start_side_runs(wanted, tmp_path_factory.mktemp("cli")) if wanted else None


@pytest.fixture(scope="module")
def side_runs(request, tmp_path_factory) -> SideRuns:
    """The side runs the selected tests need (started with the session: ``early_run``), all
    ended before any test reads its result: the per-test leak check never sees one run's
    processes while another's test runs."""
    from tests.conftest import EARLY_RUNS

    runs = EARLY_RUNS.get(__name__)
    if runs is None:  # a test not in _NEEDS asks for it: the runs its name does not list
        runs = _start_side_runs(_wanted(request.session.items) | {"tuned"}, tmp_path_factory.mktemp("cli"))
    return runs.result()


def _timed_run(bg, args: list[str], env: dict[str, str], kw: dict) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = bg.run(args, timeout=120, env=env, **kw)
    return proc, time.perf_counter() - t0


@pytest.fixture(scope="module")
def tuned(side_runs):
    """One tiny run, in a terminal of 80 columns (COLUMNS=80: rich and click read it)."""
    return side_runs["tuned"], side_runs.tmp / "result.json", side_runs.seconds("tuned"), side_runs.tmp


def flat(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as one space (prose wraps at 80)."""
    return " ".join(text.split())


def test_tune_prints_the_table_and_the_choice(tuned):
    proc, out, seconds, _ = tuned
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    text = proc.stdout
    assert "steps/s" in text and "from" in text and "config" in text  # the table's header
    rows = table_rows(text)
    assert len(rows) >= 2, text  # at least the baseline and one more measurement
    assert any("start" in " ".join(r[5:]) for r in rows), rows  # the start config, measured
    assert "Choice:" in text and f"Saved: {out}" in flat(text)
    choice = parse_config_line(text)
    assert choice.num_envs == 4
    assert "Tuning CartPole-v1 x 4 envs" in proc.stderr
    for line in (text + proc.stderr).splitlines():  # read at 80 columns: nothing past them
        assert len(line) <= 80, line
    assert "…" not in text
    assert seconds < 60


def test_tune_writes_the_json_record(tuned):
    proc, out, _, _ = tuned
    rec = json.loads(out.read_text())
    assert {"schema", "hardware", "workload", "trials", "final", "choice", "start", "num_steps", "strategy",
            "budget", "protocol"} <= set(rec)
    choice = Config.from_dict(rec["choice"]["config"])
    assert choice == parse_config_line(proc.stdout)
    assert rec["choice"]["throughput"] > 0 and rec["choice"]["why"]
    assert rec["workload"]["num_envs"] == 4 and rec["num_steps"] == 16
    assert rec["workload"]["env"] == "gym:CartPole-v1"
    assert 1 <= len(rec["trials"]) <= 3  # --budget-trials 3
    for t in rec["trials"] + rec["final"]:
        Config.from_dict(t["config"])
        assert t["status"] != "ok" or len(t["samples"]) == t["n"] >= 1
    assert rec["strategy"]["name"] == "model"


ROW = re.compile(r"^([* ]) +([\d,]+|failed|invalid) +([\d,]+-[\d,]+)? +(\d+) +(" + COMPACT.pattern
                 + r") +(\w+) *(.*?) *$")


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the printed trials table: [mark, steps/s, interval, n, config, from, note]."""
    return [[g or "" for g in m.groups()] for m in map(ROW.match, text.splitlines()) if m]


def test_the_starred_row_is_what_the_choice_line_prints_and_counts_agree(tuned):
    proc, out, _, _ = tuned
    text, rec = proc.stdout, json.loads(out.read_text())
    rows = table_rows(text)
    configs = [r[4] for r in rows]
    assert len(configs) == len(set(configs)), rows  # one row per config
    starred = [r for r in rows if r[0] == "*"]
    assert len(starred) == 1 and starred[0] is rows[0], text  # one star, on the top row
    assert starred[0][5] == "confirm" == rec["choice"]["source"]  # measured after the choice was made
    steps, interval, n = starred[0][1], starred[0][2], int(starred[0][3])
    assert starred[0][4] == COMPACT.search(text.split("Choice:")[1]).group(0)
    choice_line = flat(text.split("Choice:")[1].split("\n", 1)[1])
    assert choice_line.startswith(f"{steps} steps/s, interval {interval} ("), choice_line
    assert f"%), median of {n}; {rec['choice']['speedup_vs_serial']:.2f}x serial" in choice_line
    assert n >= 3 and interval  # an interval, and at least 3 samples behind it
    for r in rows:  # no interval printed from fewer than 3 samples
        assert (r[2] != "") == (int(r[3]) >= 3), r
    # The title and the "why" line give the same counts.
    title = re.search(r"Trials: (\d+) configs measured \((\d+) baselines? \+ (\d+) of \d+ searched", flat(text))
    why = re.search(r"why: (\d+) configs measured \((\d+) baselines \+ (\d+) of", flat(text))
    assert title and why and title.groups() == why.groups(), text
    assert int(title.group(1)) == len(rec["trials"]) == rec["counts"]["measured"]


def test_every_word_of_the_table_is_explained(tuned, side_runs):
    """The table's legend is short (the notation and the interval); --help explains each word
    (``auturi tune --help`` at 80 columns: side run "help")."""
    from auturi.cli import NOTES, SOURCES

    proc, _, _, _ = tuned
    assert "config 2x8 d2 p1@cpu b8: 2 actors x 8 envs each" in flat(proc.stdout)
    helptext = flat(side_runs["help"].stdout)
    for r in table_rows(proc.stdout):
        assert f"{r[5]}: " in helptext, r
        for word in filter(None, r[6].split(", ")):
            assert f"{word}: " in helptext, (word, r)
    for word in list(NOTES) + list(SOURCES):
        assert f"{word}: " in helptext, word


def test_tune_says_why_the_choice_wins(tuned, side_runs):
    """Each finalist's time split (table and JSON) and the share of this machine's limit
    (``auturi show`` of the record: side run "show")."""
    proc, out, _, _ = tuned
    rec = json.loads(out.read_text())
    explain = rec["explain"]
    assert explain["splits"] and explain["limit"]["steps_per_second"] > 0
    assert {"env", "inference", "waiting", "ipc"} == set(explain["splits"][0]["split"])
    assert "Where each finalist's collect time goes" in proc.stdout
    m = re.search(r"the choice reaches (\d+)% of what (\d+ cores can step|inference allows|the envs allow)",
                  flat(proc.stdout))
    assert m, proc.stdout
    assert int(m.group(1)) == round(100 * explain["limit_share"])
    shown = side_runs["show"]
    assert "the choice reaches" in shown.stdout and "Where each finalist" in shown.stdout


def test_version(side_runs):
    from auturi import __version__

    proc = side_runs["version"]
    assert proc.returncode == 0 and proc.stdout.strip() == f"auturi {__version__}"


def test_without_typer_the_entry_point_names_the_install(side_runs):
    """``import typer`` fails (side run "no_typer"): the entry point says what to install."""
    proc = side_runs["no_typer"]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ('auturi: error: the command line needs typer, which is not installed: '
                                   'pip install "auturi[cli]" (or pip install typer rich)')


def test_the_record_reports_start_up_apart(tuned):
    _, out, _, _ = tuned
    st = json.loads(out.read_text())["startup"]
    assert st["before_tune_seconds"] > 0 and st["tune_setup_seconds"] >= 0
    assert st["to_first_measurement_seconds"] == pytest.approx(st["before_tune_seconds"] + st["tune_setup_seconds"])


def test_show_prints_the_table_and_the_config_line(tuned, side_runs):
    """``auturi show`` of the record, and with ``--json`` (side runs "show", "show_json")."""
    _, out, _, _ = tuned
    proc, as_json = side_runs["show"], side_runs["show_json"]
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text())
    assert parse_config_line(proc.stdout) == Config.from_dict(rec["choice"]["config"])
    assert "steps/s" in proc.stdout and "Choice:" in proc.stdout and "CartPole-v1" in proc.stdout
    proc = as_json
    assert proc.returncode == 0
    shown = json.loads(proc.stdout)
    assert Config.from_dict(shown["choice"]) == parse_config_line(shown["config_line"])


def test_a_second_run_says_it_reuses_the_cache_and_where_the_status_page_went(tuned, side_runs):
    """The module's first run stored its record in the cache: a second one with the same
    workload (side run "second", started once the first ended) starts from it and says so,
    naming the file and --no-cache, on stderr at the start and in the report. Not in a
    terminal (stdin is not a TTY here), a --status-port page stops with the run, and the last
    line says where its final state is kept."""
    first, _, _, tmp = tuned
    assert "Reusing" not in first.stderr and "Cache:" not in first.stdout  # it started afresh: nothing to say
    cached = side_runs.cached_after_tuned  # the cache as the first run left it
    assert len(cached) == 1, cached
    page = importlib.util.find_spec("fastapi") is not None  # the status server is the [server] extra
    out = tmp / "second.json"
    proc = side_runs["second"]
    assert proc.returncode == 0, proc.stderr
    err, report = flat(proc.stderr), flat(proc.stdout)
    assert f"Reusing the cached choice from {cached[0]} (" in err and "(auturi tune --no-cache to measure" in err
    assert f"Cache: this run started from the choice cached in {cached[0]} (auturi tune --no-cache" in report
    assert json.loads(out.read_text())["cache_hit"] is True
    if page:
        last = flat(proc.stderr.split("Status: ")[-1])
        assert re.search(rf"The status page at http://127\.0\.0\.1:\d+/ stopped with the run; its final state is "
                         rf"the record {re.escape(str(out))} \(auturi show {re.escape(str(out))}\)", last), last
    for line in (proc.stdout + proc.stderr).splitlines():
        assert len(line) <= 80 or "/" in line, line  # only a path longer than the line may pass it


def _status_port_run(bg, tmp: Path, env: dict[str, str]) -> tuple[dict, float]:
    """A ``--json --status-port 0`` tune of a module:factory env on the shm backend, its status
    read over HTTP while it runs (a side run of its own, started beside the others): what was
    seen, for test_json_output_module_factory_shm_and_status_port to check, and the seconds.
    The process has ended when this returns."""
    import httpx

    t0 = time.perf_counter()
    tmp.mkdir()
    (tmp / "my_envs.py").write_text("from auturi.envs import CountingEnv\n\n\n"
                                    "def make():\n    return CountingEnv(max_len=20)\n")
    stdout = tmp / "stdout.json"
    seen: dict = {"lines": [], "url": None, "phases": set(), "status": None}
    with open(stdout, "w") as f:
        proc = bg.popen(
            [sys.executable, "-m", "auturi.cli", "tune", "my_envs:make", "--policy", "mlp", "--backend", "shm",
             "--start", "num_actors=2", "--budget-trials", "2", "--num-envs", "4", "--num-steps", "8",
             "--max-trial-seconds", "1", "--budget-seconds", "1",  # start and serial are measured whatever the budget
             "--no-cache", "--json", "--status-port", "0", "--status-linger", "30"],
            stdout=f, stderr=subprocess.PIPE, text=True, cwd=tmp, env=env)
    lines = seen["lines"]
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        url, deadline = None, time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = next((re.search(r"Status: (http://127\.0\.0\.1:\d+/)", ln) for ln in list(lines)
                      if "Status:" in ln), None)
            url = m.group(1) if m else None
            time.sleep(0.05)
        seen["url"] = url
        if url is None:
            return seen, time.perf_counter() - t0
        while time.monotonic() < deadline:
            seen["status"] = httpx.get(url + "status", timeout=10).json()
            seen["phases"].add(seen["status"]["phase"])
            if seen["status"]["phase"] == "done":
                break
            time.sleep(0.1)
        if seen["status"]["phase"] != "done":
            return seen, time.perf_counter() - t0
        seen["trials"] = httpx.get(url + "trials", timeout=10).json()
        seen["metrics"] = httpx.get(url + "metrics", timeout=10).text
        # the record is on stdout once tuning ended, while the server lingers
        deadline = time.monotonic() + 30
        while not stdout.read_text().rstrip().endswith("}") and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["record"] = stdout.read_text()
    finally:
        proc.terminate()  # ends the linger
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            bg.reaped(proc)
        reader.join(5)
    return seen, time.perf_counter() - t0


def test_json_output_module_factory_shm_and_status_port(side_runs):
    """``--json`` prints only JSON on stdout; ENV as module:factory from the working directory
    reaches forkserver workers; ``--status-port 0`` serves the run's status (side run
    "status_port": ``_status_port_run``)."""
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    seen = side_runs["status_port"]
    url, s = seen["url"], seen["status"]
    assert url, f"no status URL on stderr: {seen['lines']}"
    assert s["phase"] == "done", seen["phases"]
    trials = seen["trials"]
    assert trials["total"] >= 2 and Config.from_dict(s["best_config"]).num_envs == 4
    assert "auturi_tuner_trials_total" in seen["metrics"]
    rec = json.loads(seen["record"])
    assert Config.from_dict(rec["choice"]["config"]).num_envs == 4
    assert rec["workload"]["env"] == "my_envs.make" and rec["workload"]["backend"] == "shm"
    assert rec["status_url"] == url
    start = Config(num_actors=2, envs_per_actor=2)  # two actor processes: the factory reached workers
    assert Config.from_dict(rec["start"]) == start
    assert any(Config.from_dict(t["config"]) == start and t["status"] == "ok" for t in rec["trials"])


def _errors_case(tmp: Path) -> list[tuple[list[str], str]]:
    cases = [
        (["tune", "Foo-v9"], "unknown gymnasium env id 'Foo-v9'"),
        (["tune", "Cartpole-v1"], "Similar ids"),
        (["tune", "no_such_module_xyz:make"], "cannot import module"),
        (["tune", "CartPole-v1", "--budget-trials", "0"], "--budget-trials must be >= 1"),
        (["tune", "CartPole-v1", "--budget-seconds", "-5"], "--budget-seconds must be > 0"),
        (["tune", "CartPole-v1", "--policy", "cnn"], "use --policy mlp"),
        (["tune", "CartPole-v1", "--start", "num_actors=3"], "num_actors=3 must divide --num-envs 8"),
        (["tune", "CartPole-v1", "--start", "env_parallel_degree=3"], "env_parallel_degree=3 is invalid"),
        (["tune", "CartPole-v1", "--status-port", "0", "--status-host", "0.0.0.0"], "--status-token"),
        (["show", str(tmp / "missing.json")], "no such file"),
        (["tune", "CartPole-v1", "--address", "auto"], "--address auto is for --backend ray"),
        (["tune", "CartPole-v1", "--worker-timeout", "0"], "--worker-timeout must be a number of seconds > 0"),
    ]
    import torch

    if not torch.cuda.is_available():
        cases.append((["tune", "CartPole-v1", "--devices", "cpu,cuda"], "no CUDA device here"))
    return cases


ENTRY_POINT_RUNS = """
import contextlib, io, json, runpy, sys, traceback

results = []
for args in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["auturi", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("auturi.cli", run_name="__main__", alter_sys=True)  # what python -m runs
            code = 0
        except SystemExit as e:  # the exit status the interpreter would end with
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what the interpreter would print, and its status
            traceback.print_exc()
            code = 1
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""
"""Runs ``python -m auturi.cli ARGS`` for each ARGS of a JSON list on stdin, one after another in
this one process (as ``-m`` does: ``runpy.run_module(..., run_name="__main__")``), and prints
each run's exit status, stdout and stderr as JSON."""


def test_bad_input_exits_2_with_one_line_and_no_traceback(side_runs):
    """Each bad input: exit 2, one line on stderr naming the problem, nothing on stdout, no
    traceback. The runs go through the entry point in one process (ENTRY_POINT_RUNS, side run
    "bad_input"): 13 interpreters importing the command line at once took ~12 s of a core
    (2026-11-26); the other tests here start it as a process of its own, which is what the
    console script does."""
    cases = _errors_case(side_runs.tmp / "bad_input")
    proc = side_runs["bad_input"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert len(results) == len(cases)
    for (args, want), (code, out, err) in zip(cases, results):
        assert code == 2, (args, code, err)
        assert "Traceback" not in err and "Traceback" not in out, (args, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("auturi: error: "), (args, err)
        assert want in lines[0], (args, lines[0])
        assert out == ""


def test_policy_from_a_saved_sb3_model(side_runs):
    pytest.importorskip("stable_baselines3")
    ok, wrong = side_runs["policy_ok"], side_runs["policy_wrong"]
    assert ok.returncode == 0, ok.stderr
    rec = json.loads(ok.stdout)
    assert rec["workload"]["policy"]["class"].endswith("SB3PolicyAdapter")
    assert Config.from_dict(rec["choice"]["config"]).num_envs == 2
    assert wrong.returncode == 2 and "the model expects observations" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_worker_timeout_and_address_reach_the_executor(side_runs):
    """--worker-timeout is the executor's worker_timeout: it overrides an AUTURI_WORKER_TIMEOUT
    the executor would refuse; --address is the Ray backend's (an address nobody listens on
    fails at once, naming it and the fix: test_ray_cluster_cli's case of it too). Without Ray,
    --backend ray is one line naming the install. (Side runs TIMEOUT_RUNS, with
    AUTURI_WORKER_TIMEOUT=never.)"""
    with_ray = importlib.util.find_spec("ray") is not None
    bad_env, ok, out = (side_runs[name] for name in TIMEOUT_RUNS[:3])
    far = [side_runs["ray_far"]] if with_ray else []
    assert bad_env.returncode == 1 and "worker_timeout must be a number of seconds" in bad_env.stderr, bad_env.stderr
    assert ok.returncode == 0, ok.stderr
    if with_ray:
        far = far[0]
        assert far.returncode == 1 and "'127.0.0.1:1'" in far.stderr and "ray start --head" in far.stderr, far.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and lines == ['auturi: error: --backend ray needs Ray, which is not installed: '
                                             'pip install "auturi[ray]"'], out.stderr


def test_an_unwritable_cache_loses_nothing(side_runs):
    """The issue's case: the whole search ran, then PermissionError, exit 1 and no --out. Now
    --out is written, the run exits 0, and one warning line names the directory and the fix.
    The cache directory lies under a regular file, so this holds when the tests run as root."""
    tmp = side_runs.tmp
    proc, cache_dir = side_runs["unwritable"], tmp / "unwritable" / "a_file" / "cache"
    out = tmp / "unwritable" / "result.json"
    assert proc.returncode == 0, proc.stderr
    assert Config.from_dict(json.loads(out.read_text())["choice"]["config"]).num_envs == 2
    warned = [ln for ln in proc.stderr.splitlines() if "warning" in ln.lower()]
    assert len(warned) == 1 and warned[0].startswith("auturi: warning: "), proc.stderr
    assert str(cache_dir) in warned[0] and "AUTURI_CACHE_DIR=" in warned[0] and "--no-cache" in warned[0]
    assert "Traceback" not in proc.stderr and "Record cached" not in proc.stderr


MARKER_ENV = '''import os

import gymnasium as gym

_steps = 0


class Marked(gym.Wrapper):
    """CartPole that creates $MARKER once it has stepped 300 times: tuning is under way."""

    def step(self, action):
        global _steps
        _steps += 1
        if _steps == 300:
            open(os.environ["MARKER"], "w").close()
        return self.env.step(action)


def make():
    return Marked(gym.make("CartPole-v1"))
'''


INTERRUPTS = [("SIGTERM", True), ("SIGINT", False)]


@pytest.fixture(scope="module")
def interrupted_runs(request, tmp_path_factory) -> dict[tuple[str, bool], tuple]:
    """The selected cases of the interrupted-tune test, started at once (each mostly one core's
    work until its marker shows; one after another they took ~8 s, 2026-11-27), each sent its
    signal as soon as its env has stepped 300 times, all ended before any test reads its
    result. Per case ``(signame, with_out)``: ``(tmp folder, returncode, stdout, stderr,
    whether the marker showed before the process ended or 90 s passed)``."""
    import signal

    cases = [tuple(item.callspec.params[k] for k in ("signame", "with_out")) for item in request.session.items
             if getattr(item, "module", None) is request.module
             and item.originalname == "test_an_interrupted_tune_says_what_it_was_doing_and_writes_the_partial_record"]
    runs = {}
    try:
        for signame, with_out in dict.fromkeys(cases):
            tmp = tmp_path_factory.mktemp(f"interrupted_{signame}")
            (tmp / "marked_env.py").write_text(MARKER_ENV)
            marker, out = tmp / "tuning-started", tmp / "partial.json"
            args = [sys.executable, "-m", "auturi.cli", "tune", "marked_env:make", "--backend", "serial", "--strategy",
                    "grid", "--num-envs", "2", "--num-steps", "16", "--budget-seconds", "300",
                    *(["--out", str(out)] if with_out else [])]
            # SIGINT is Python's KeyboardInterrupt only where the parent did not ignore it (a
            # background job's shell does): reset it for the child.
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                                    env=dict(cli_env(tmp), MARKER=str(marker)),
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            runs[(signame, with_out)] = (tmp, marker, proc)
        deadline, waiting, seen = time.monotonic() + 90, set(runs), {}
        while waiting and time.monotonic() < deadline:
            for case in list(waiting):
                _, marker, proc = runs[case]
                if marker.exists():
                    proc.send_signal(getattr(signal, case[0]))
                elif proc.poll() is None:
                    continue
                seen[case] = marker.exists()
                waiting.discard(case)
            time.sleep(0.05)
        for case in waiting:  # no marker within 90 s: nothing to interrupt
            runs[case][2].kill()
        done = {}
        for case, (tmp, _, proc) in runs.items():
            stdout, stderr = proc.communicate(timeout=60)
            done[case] = (tmp, proc.returncode, stdout, stderr, seen.get(case, False))
        return done
    finally:
        for _, _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)


@pytest.mark.parametrize("signame,with_out", INTERRUPTS)
def test_an_interrupted_tune_says_what_it_was_doing_and_writes_the_partial_record(interrupted_runs, signame,
                                                                                  with_out):
    """SIGTERM (a scheduler's stop) used to end ``auturi tune`` silently, with nothing saved.
    Now it is handled as Ctrl-C is: every worker stopped, one line saying what was running
    and where the partial record is; the record holds the trials measured so far. (The runs:
    ``interrupted_runs``.)"""
    tmp_path, returncode, stdout, stderr, marked = interrupted_runs[(signame, with_out)]
    out = tmp_path / "partial.json"
    assert marked, (returncode, stdout, stderr)  # tuning was under way when the signal came
    code, words = (143, "terminated (SIGTERM)") if signame == "SIGTERM" else (130, "interrupted (Ctrl-C)")
    assert returncode == code, stderr
    line = next((ln for ln in stderr.splitlines() if ln.startswith("auturi: ")), "")
    assert line.startswith(f"auturi: {words} during the ") and "every worker was stopped" in line, stderr
    m = re.search(r"partial record: (\S+) \(auturi show", line)
    assert m, line
    saved = Path(m.group(1))
    assert saved == (out if with_out else tmp_path / "cache" / saved.name)
    rec = json.loads(saved.read_text())
    assert rec["interrupted"]["signal"] == signame and rec["interrupted"]["phase"] in line
    assert rec["trials"] and all(t["status"] in ("ok", "running") for t in rec["trials"])
    assert "Traceback" not in stderr
    shown = cli("show", str(saved), tmp=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"interrupted by {signame}" in shown.stdout and "auturi.Config(" in shown.stdout
