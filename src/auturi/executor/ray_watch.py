"""``worker_timeout`` for the ``ray`` backend: :class:`ProgressWatch`, the progress probes a
:class:`~auturi.executor.ray_executor.RayExecutor` sends its busy actors while it waits."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from auturi.executor.ray_executor import RayExecutor

PROBE_SECONDS = 0.5
"""How often a collect asks each busy actor for its progress (``worker_timeout``)."""


class ProgressWatch:
    """``worker_timeout`` for Ray actors during a collect or weight update: every
    ``PROBE_SECONDS`` each busy actor is asked for its progress word (``RayActorHost.progress``,
    in its ``control`` thread); an actor whose word has not moved, or that has not answered, for
    ``worker_timeout`` seconds is stuck. An actor waiting on a stuck worker of its own keeps
    moving its word and reports that worker itself, so the innermost stuck process is named."""

    def __init__(self, ex: "RayExecutor", t0: float):
        self.ex, self.t0 = ex, t0
        self.probes: dict[int, Any] = {}
        self.seen: dict[int, int] = {}
        self.since: dict[int, float] = {}
        self.asked = 0.0

    def check(self, indices: list[int], now: float) -> None:
        import ray

        if self.probes:
            ready, _ = ray.wait(list(self.probes.values()), num_returns=len(self.probes), timeout=0)
            for i, ref in list(self.probes.items()):
                if ref in ready:
                    del self.probes[i]
                    try:
                        value = ray.get(ref)
                    except Exception:  # a dead actor: its own call fails and says why
                        continue
                    if value != self.seen.get(i):
                        self.seen[i], self.since[i] = value, now
        for i in indices:
            idle = now - self.since.setdefault(i, self.t0)
            if idle > self.ex.worker_timeout:
                self.ex._probes = list(self.probes.values())
                raise self.ex._stuck(self.ex._actors[i], idle)
        if now - self.asked >= PROBE_SECONDS:
            self.asked = now
            for i in indices:
                if i not in self.probes:
                    handle = self.ex._actors[i].handle
                    self.probes[i] = handle.progress.options(concurrency_group="control").remote()
        self.ex._probes = list(self.probes.values())
