"""The README's examples must run as written."""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, "README.md")).read(), re.S)
TIMEOUT = 300  # seconds for each example
SLOTS = 1  # examples run at a time, in the background beside other modules' tests (one core's work each)


def cache_dir(index: int, tmp: Path) -> Path:
    """The results cache of example ``index``: its own, under the test's temporary folder (a
    first-time user's empty cache), never the user's real one (``auturi.tune`` writes its record
    there; a record left by an earlier run would also let the example skip its search)."""
    return tmp / f"cache{index}"


def _start_examples(indices, tmp: Path):
    """Examples ``indices``, SLOTS at a time, the two longest first (RLlib's, mostly Ray
    starting its processes, and the ``auturi.tune`` one, whose 10-second budget it spends
    measuring: ~15 s each alone), then the others (~6-9 s each), in the background
    (conftest's BackgroundThread; its ``result()``: ``{index: result of run_example}``). Each
    one's environment is this process's as the session starts (the tests that run meanwhile
    may change it)."""
    from tests.conftest import BackgroundThread

    wanted = sorted(set(indices), key=lambda i: ("ray.init(" not in BLOCKS[i], "auturi.tune(" not in BLOCKS[i],
                                                 ".learn(" not in BLOCKS[i], i))
    environ = dict(os.environ)

    def run_all(bg):
        with ThreadPoolExecutor(SLOTS) as pool:
            futures = {i: pool.submit(run_example, environ, i, tmp, bg) for i in wanted}
        return {i: f.result() for i, f in futures.items()}

    return BackgroundThread(run_all, "test_readme examples")


def run_example(environ: dict, index: int, tmp: Path, bg) -> subprocess.CompletedProcess | None:
    """Example ``index`` as a script in a fresh process (started by ``bg``, conftest's
    BackgroundThread) with the environment ``environ``; None when it ran past TIMEOUT (it is
    then killed)."""
    script = tmp / f"example{index}.py"
    script.write_text(BLOCKS[index])
    env = dict(environ, AUTURI_CACHE_DIR=str(cache_dir(index, tmp)))  # AUTURI_CACHE_DIR wins over XDG and ~
    try:
        return bg.run([sys.executable, str(script)], timeout=TIMEOUT, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return None


def _selected(items) -> list[int]:
    return [item.callspec.params["index"] for item in items
            if getattr(item, "module", None) is not None and item.module.__name__ == __name__
            and hasattr(item, "callspec")]


def early_run(items, tmp_path_factory):
    """Called by conftest's ``_start_early_runs`` as the session starts: the selected examples
    (None if none) run in the background, after the background runs of the modules before
    this one (test_cli's), beside the modules before this one, which mostly keep one core
    busy, instead of making this module wait ~26 s for them on 2 cores (2026-11-27)."""
    indices = _selected(items)
    if not indices:
        return None
    tmp = tmp_path_factory.mktemp("readme")
    return _Examples(_start_examples(indices, tmp), tmp)


class _Examples:
    """An early run's handle: the examples' BackgroundThread and their temporary folder."""

    def __init__(self, runs, tmp: Path):
        self.runs, self.tmp = runs, tmp

    def end(self) -> None:
        self.runs.end()


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """``({index: result of run_example}, the temporary folder)`` for the selected examples
    (started with the session: ``early_run``). All have ended before any test reads its
    result: the per-test leak check never sees one example's workers while another's test
    runs."""
    from tests.conftest import EARLY_RUNS

    early = EARLY_RUNS.get(__name__)
    if early is None:
        tmp = tmp_path_factory.mktemp("readme")
        early = _Examples(_start_examples(_selected(request.session.items), tmp), tmp)
    return early.runs.result(), early.tmp


@pytest.mark.timeout(2 * TIMEOUT)  # the first one's setup waits for every example (run one at a time)
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(runs, index):
    out = runs[0][index]
    assert out is not None, f"example {index} did not end within {TIMEOUT} s"
    assert out.returncode == 0, out.stderr[-3000:]
    if "make_executor" in BLOCKS[index]:
        lines = out.stdout.strip().splitlines()
        assert len(lines) == 3 and all("(128, 16)" in line for line in lines)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


TUNE_EXAMPLES = [i for i, block in enumerate(BLOCKS) if "auturi.tune(" in block]


@pytest.mark.parametrize("index", TUNE_EXAMPLES)
def test_the_tune_example_keeps_its_record_in_the_tests_own_cache(runs, index):
    """The example ran with AUTURI_CACHE_DIR set: its record is in the test's folder (so it
    was not written to the user's cache), and it searched afresh (no record reused)."""
    out = runs[0][index]
    assert out is not None and out.returncode == 0, out and out.stderr[-3000:]
    records = list(cache_dir(index, runs[1]).glob("*.json"))
    assert len(records) == 1, records
    assert json.loads(records[0].read_text())["cache_hit"] is False
