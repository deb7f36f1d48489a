"""The README's examples must run as written."""
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


def run_example(index: int, tmp: Path) -> subprocess.CompletedProcess | None:
    """Example ``index`` as a script in a fresh process; None when it ran past TIMEOUT (it
    is then killed)."""
    script = tmp / f"example{index}.py"
    script.write_text(BLOCKS[index])
    try:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """``{index: result of run_example}`` for the selected examples. They are independent, so
    they run two at a time, slowest first (RLlib's, mostly Ray starting its processes, uses
    about one core; the others go one after another beside it), and all have ended before
    any test reads its result: the per-test leak check never sees one example's workers
    while another's test runs."""
    mine = [item for item in request.session.items
            if getattr(item, "module", None) is request.module and hasattr(item, "callspec")]
    wanted = sorted({item.callspec.params["index"] for item in mine},  # those selected (-k, a test id) only
                    key=lambda i: ("ray.init(" not in BLOCKS[i], ".learn(" not in BLOCKS[i], i))
    tmp = tmp_path_factory.mktemp("readme")
    with ThreadPoolExecutor(SLOTS) as pool:
        futures = {i: pool.submit(run_example, i, tmp) for i in wanted}
    return {i: f.result() for i, f in futures.items()}


@pytest.mark.timeout(2 * TIMEOUT)  # the first one's setup runs every example, two at a time
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(runs, index):
    out = runs[index]
    assert out is not None, f"example {index} did not end within {TIMEOUT} s"
    assert out.returncode == 0, out.stderr[-3000:]
    if "make_executor" in BLOCKS[index]:
        lines = out.stdout.strip().splitlines()
        assert len(lines) == 3 and all("(128, 16)" in line for line in lines)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
