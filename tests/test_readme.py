"""The README's examples must run as written."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, "README.md")).read(), re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(tmp_path, index):
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    if "make_executor" in BLOCKS[index]:
        lines = out.stdout.strip().splitlines()
        assert len(lines) == 3 and all("(128, 16)" in line for line in lines)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
