"""The results cache on files a user's machine may hold: bytes that are not text, a cache
path that is a file. Each is one warning naming the problem; the run goes on."""
from __future__ import annotations

import warnings

import pytest

from auturi import Config
from auturi.tuner import ResultsCache
from auturi.tuner.cache import CacheWarning, _warned_dirs

HW, WL = {"cpu_model": "x", "cores": 2}, {"env": "e", "num_envs": 4}
RECORD = {"hardware": HW, "workload": WL, "choice": {"config": Config(1, 4).to_dict(), "throughput": 5.0}}


def test_a_cache_file_that_is_not_text_is_skipped_with_a_cache_warning(tmp_path):
    cache = ResultsCache(tmp_path)
    cache.path(HW, WL).write_bytes(b"\xff\xfe\x00garbage\x80\x81")
    with pytest.warns(CacheWarning, match="ignoring unreadable Auturi cache file"):
        assert cache.load(HW, WL) is None
    assert cache.store(RECORD) is not None  # overwritten by the next store
    assert cache.best(HW, WL) == (Config(1, 4), 5.0)


def test_a_cache_path_that_is_a_file_is_named_as_one(tmp_path):
    blocker = tmp_path / "cachefile"
    blocker.write_text("")
    _warned_dirs.discard(str(blocker))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ResultsCache(blocker).store(RECORD) is None
    (w,) = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert f"{blocker} is a file, not a directory" in str(w.message)
