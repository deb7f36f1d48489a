"""``auturi tune`` and the results cache: a run that starts from a cached choice says so and
names the file, ``--out`` is written before the cache store, and a cache that cannot be used
is one ``auturi: warning:`` line (see :mod:`auturi.tuner.cache`)."""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from auturi.cli.common import stderr
from auturi.cli.render import compact, fmt, say


class StoreAfterOut:
    """The tuner's results cache with its store held back: ``auturi tune`` writes ``--out``
    first and stores into the cache after (:meth:`flush`), so what the user asked for never
    waits on an optimisation. Reads go straight through."""

    def __init__(self, cache: Any):
        self.cache = cache
        self.directory = cache.directory
        self.pending: dict[str, Any] | None = None

    def load(self, hardware: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any] | None:
        return self.cache.load(hardware, workload)

    def path(self, hardware: dict[str, Any], workload: dict[str, Any]) -> Path:
        return self.cache.path(hardware, workload)

    def best(self, hardware: dict[str, Any], workload: dict[str, Any]) -> Any:
        return self.cache.best(hardware, workload)

    def store(self, record: dict[str, Any]) -> None:
        self.pending = record

    def flush(self) -> Path | None:
        """Store the held record; its file, or None (nothing held, or the cache could not be
        written: :class:`~auturi.tuner.cache.CacheWarning`)."""
        rec, self.pending = self.pending, None
        return self.cache.store(rec) if rec is not None else None


@contextlib.contextmanager
def cache_warnings_as_lines() -> Iterator[None]:
    """A :class:`~auturi.tuner.cache.CacheWarning` (once per directory already) becomes one
    ``auturi: warning: ...`` line on stderr, shown even under ``-W ignore``: a cache that
    cannot be written costs the next run its head start, and the user should know why."""
    from auturi.tuner.cache import CacheWarning

    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if isinstance(category, type) and issubclass(category, CacheWarning):
            stderr().print(f"auturi: warning: {message}", markup=False, soft_wrap=True)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.filterwarnings("always", category=CacheWarning)
        warnings.showwarning = show
        yield


def cache_notice(tuner: Any, console: Any) -> Path | None:
    """Once the tuner has read the results cache: the record it starts from (None when it
    starts afresh), announced on ``console`` (None: quiet) with how to measure afresh."""
    cached = getattr(tuner, "cached", None)
    if not cached or tuner.cache is None:
        return None
    try:
        path = Path(tuner.cache.path(tuner.hardware, tuner.workload))
    except Exception:  # noqa: BLE001 - the notice must never stop tuning
        return None
    if console is not None:
        config, sps = cached
        then = f", {fmt(sps)} steps/s then" if sps else ""
        say(console, f"Reusing the cached choice from {path} ({compact(config)}{then}): measured first, and the "
                     f"search is skipped if it holds up (auturi tune --no-cache to measure afresh)")
    return path
