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
SLOTS = 2  # examples run at a time: the 2 cores this suite is sized for


def cache_dir(index: int, tmp: Path) -> Path:
    """The results cache of example ``index``: its own, under the test's temporary folder (a
    first-time user's empty cache), never the user's real one (``auturi.tune`` writes its record
    there; a record left by an earlier run would also let the example skip its search)."""
    return tmp / f"cache{index}"


def run_example(index: int, tmp: Path) -> subprocess.CompletedProcess | None:
    """Example ``index`` as a script in a fresh process; None when it ran past TIMEOUT (it
    is then killed)."""
    script = tmp / f"example{index}.py"
    script.write_text(BLOCKS[index])
    env = dict(os.environ, AUTURI_CACHE_DIR=str(cache_dir(index, tmp)))  # AUTURI_CACHE_DIR wins over XDG and ~
    try:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT,
                              cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """``({index: result of run_example}, the temporary folder)`` for the selected examples.
    They are independent, so they run two at a time, the two longest first (RLlib's, mostly Ray
    starting its processes, and the ``auturi.tune`` one, whose 10-second budget it spends
    measuring: ~15 s each alone), then the others beside them (~6-9 s each): ~26 s in all on 2
    cores against ~32 s when the tune example ran last (measured 2026-11-26; 3 or 4 at a time
    measured no faster, the examples then share the cores). All have ended before any test
    reads its result: the per-test leak check never sees one example's workers while another's
    test runs."""
    mine = [item for item in request.session.items
            if getattr(item, "module", None) is request.module and hasattr(item, "callspec")]
    wanted = sorted({item.callspec.params["index"] for item in mine},  # those selected (-k, a test id) only
                    key=lambda i: ("ray.init(" not in BLOCKS[i], "auturi.tune(" not in BLOCKS[i],
                                   ".learn(" not in BLOCKS[i], i))
    tmp = tmp_path_factory.mktemp("readme")
    with ThreadPoolExecutor(SLOTS) as pool:
        futures = {i: pool.submit(run_example, i, tmp) for i in wanted}
    return {i: f.result() for i, f in futures.items()}, tmp


@pytest.mark.timeout(2 * TIMEOUT)  # the first one's setup runs every example, two at a time
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
