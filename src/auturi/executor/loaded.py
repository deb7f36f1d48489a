"""An env's step with every core busy: copies of one env stepped at once, one per core, each in
a process of its own, with random actions and nothing else (no policy, no IPC while they run).
A measurement of the machine for the tuner's profile (:func:`auturi.tuner.profile.profile_executor`),
here beside the executor because its copies start the way env workers do.

One env timed alone (:func:`auturi.tuner.timing.time_env`) steps faster than each of many
loaded cores can: they share caches, memory bandwidth and, on most cloud machines, a physical
core between two vCPUs. On the H200 box of 2026-11-27 (16 vCPUs, Pong) the profile's env alone
stepped 1.28x faster than each of 16 processes stepping at once (20,121 steps/s estimated,
15,314 measured), so the tuner's limit line overstated what the cores can step, and the model
had no loaded step factor until a parallel layout was measured (it predicted 1.73x the measured
throughput of its choice). :func:`time_env_loaded` measures it; ``auturi tune`` (the offline
tuner) does so on machines of :data:`MIN_CORES` or more (a few seconds of its budget), and
:func:`auturi.tuner.profile.profile_executor` turns it into the profile's ``loaded_step_factor``
and the limit's measured envs-only rate.

The copies fork from Auturi's env workers' server (the env factory's modules preloaded), so
they start in milliseconds; they make their env, step it for ``warmup`` seconds, wait until
every copy is ready, then step for ``seconds`` together.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MIN_CORES = 4
"""Fewer cores than this: no loaded measurement (on 2 cores its 2 copies say little the
per-layout fit does not, and every process start is dear)."""


@dataclass(frozen=True)
class LoadedTiming:
    """What :func:`time_env_loaded` measured.

    ``step_seconds``: the mean wall seconds of one step in a loaded copy (its steps over its
    stepping time, averaged over the copies); ``steps_per_second``: all copies together;
    ``processes``: how many stepped at once; ``cpu_fraction``: their CPU over wall time."""

    step_seconds: float
    steps_per_second: float
    processes: int
    cpu_fraction: float


def loaded_step_factor(alone_seconds: float, cpu_fraction: float, loaded_seconds: float) -> float:
    """The profile's ``loaded_step_factor`` from a step alone (``alone_seconds``, of which
    ``cpu_fraction`` computes) and a loaded one: how much longer the computing part took,
    within the model's bounds [1, 4] (the waiting part does not grow with load).

    >>> loaded_step_factor(1e-3, 1.0, 1.28e-3)
    1.28
    >>> loaded_step_factor(1e-3, 0.5, 1.5e-3)   # half of it waits: the computing half doubled
    2.0
    >>> loaded_step_factor(1e-3, 1.0, 0.9e-3)   # noise below 1: no slower than alone
    1.0
    """
    cpu = alone_seconds * min(1.0, max(0.0, cpu_fraction))
    if cpu <= 0 or loaded_seconds <= 0:
        return 1.0
    wait = alone_seconds - cpu
    return round(min(4.0, max(1.0, (loaded_seconds - wait) / cpu)), 4)


def _copy(env_fn: Any, seed: int, warmup: float, seconds: float, conn: Any) -> None:
    """One copy (in its own process): make the env, step ``warmup`` seconds, say ready, wait
    for the go, step ``seconds``, send ``(steps, wall, cpu)``."""
    try:
        quiet = getattr(env_fn, "for_timing", None)
        env = (quiet() if callable(quiet) else env_fn)()
        try:
            env.reset(seed=seed)
            env.action_space.seed(seed)

            def run(limit: float) -> tuple[int, float, float]:
                steps, w0, c0 = 0, time.perf_counter(), time.process_time()
                while time.perf_counter() - w0 < limit or steps == 0:
                    _, _, term, trunc, _ = env.step(env.action_space.sample())
                    if term or trunc:
                        env.reset()
                    steps += 1
                return steps, time.perf_counter() - w0, time.process_time() - c0

            run(warmup)
            conn.send("ready")
            if conn.recv() is None:
                return
            conn.send(run(seconds))
        finally:
            env.close()
    except Exception as e:  # the parent logs it and measures nothing
        conn.send(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def time_env_loaded(env_fn: Any, processes: int, seconds: float = 1.0, warmup: float = 0.3, seed: int = 0,
                    timeout: float = 60.0) -> LoadedTiming | None:
    """Step ``processes`` copies of ``env_fn``'s env at once, one per process, for about
    ``seconds``: :class:`LoadedTiming`, or None (logged) when it could not (no forkserver on
    this platform, a copy that failed or did not answer within ``timeout`` seconds). Every
    process it starts has ended when it returns."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods() or processes < 1:
        return None
    from auturi.executor.shm.forkservers import EnvProcess, modules_to_preload
    from auturi.executor.shm.processes import start_without_main

    ctx = mp.get_context("forkserver")
    preload = modules_to_preload(env_fn)
    procs, conns = [], []
    try:
        for k in range(processes):
            mine, theirs = ctx.Pipe()
            p = EnvProcess(target=_copy, args=(env_fn, seed + k, warmup, seconds, theirs), daemon=True)
            p.preload = preload  # type: ignore[attr-defined]
            start_without_main(p)
            theirs.close()
            procs.append(p)
            conns.append(mine)
        end = time.perf_counter() + timeout
        for c in conns:  # every copy made its env and warmed up: they step together
            msg = c.recv() if c.poll(max(0.0, end - time.perf_counter())) else "no answer"
            if msg != "ready":
                log.info("loaded env timing skipped: a copy said %s", msg)
                return None
        for c in conns:
            c.send(True)
        results = []
        for c in conns:
            msg = c.recv() if c.poll(max(0.0, end - time.perf_counter()) + seconds) else "no answer"
            if not isinstance(msg, tuple):
                log.info("loaded env timing skipped: a copy said %s", msg)
                return None
            results.append(msg)
    except Exception as e:  # an optimisation of the tuner's profile, never its failure (an env that does not pickle)
        log.info("loaded env timing skipped: %s: %s", type(e).__name__, e)
        return None
    finally:
        for c in conns:
            try:
                c.send(None)  # a copy still waiting for the go ends
            except (OSError, ValueError):
                pass
            c.close()
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join()
    step = sum(w / s for s, w, _ in results) / len(results)
    rate = sum(s / w for s, w, _ in results if w > 0)
    cpu = sum(c for _, _, c in results) / max(1e-9, sum(w for _, w, _ in results))
    return LoadedTiming(step_seconds=step, steps_per_second=rate, processes=len(results),
                        cpu_fraction=min(1.0, cpu))
