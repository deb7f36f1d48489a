"""A module whose import waits until told to go (for tests/test_env_preload.py; not a test
module): a forkserver preloading it first is caught in the middle of its imports, before
Auturi's own preload has run. With ``AUTURI_TEST_IMPORT_MARK`` set, the importing process
writes its pid to that file, then waits for ``<file>.go`` to exist (at most 20 s)."""
import os
import time

from auturi.executor.shm.forkservers import PreloadedProcess

_mark = os.environ.get("AUTURI_TEST_IMPORT_MARK")
if _mark and not os.path.exists(_mark + ".go"):
    with open(_mark + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(_mark + ".tmp", _mark)
    _until = time.monotonic() + 20
    while not os.path.exists(_mark + ".go") and time.monotonic() < _until:
        time.sleep(0.01)


class ProbeFirstProcess(PreloadedProcess):
    """A process of the server that preloads this module before anything of Auturi's."""

    BASE = ("tests.slow_import_probe",)


def say(conn):
    conn.send("forked")
    conn.close()
