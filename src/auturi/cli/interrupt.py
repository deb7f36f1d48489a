"""What ``auturi tune`` does when it is interrupted (Ctrl-C, or SIGTERM from a scheduler or
``kill``): SIGTERM is raised as a ``KeyboardInterrupt`` so the same clean-up runs (every
worker stopped, nothing left in /dev/shm), and what was measured is written as a partial
record (``--out``, else the cache directory), which the exit message names."""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from auturi.cli.common import EXIT_INTERRUPTED, CliError
from auturi.cli.render import compact

EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, the shell's code for a process ended by SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be, so the same clean-up
    runs (every worker stopped, nothing left in /dev/shm) instead of the process vanishing."""


class Interrupted(CliError):
    """An interrupted ``tune``: the message says what was running and where the partial
    record is; printed without the ``error:`` prefix."""


def signal_words(e: BaseException) -> str:
    return "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted (Ctrl-C)"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While tuning, SIGTERM (a scheduler's stop, ``kill``) raises :class:`Terminated` in the
    main thread. A second SIGTERM during the clean-up that follows is ignored, so the clean-up
    finishes (a scheduler that will not wait sends SIGKILL)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):  # no signals here (an embedding host): SIGTERM keeps its default
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted(e: BaseException, tuner: Any, start: Any, num_steps: int, out_path: Path | None,
                out: Path | None) -> Interrupted:
    """What an interrupted ``tune`` says, after writing what it measured as a partial record."""
    what = signal_words(e)
    code = EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
    if tuner is None or getattr(tuner, "t0", None) is None:
        return Interrupted(f"{what} while starting, before any measurement; nothing to save; every worker was "
                           f"stopped", code)
    phase = str(getattr(tuner, "phase", "?"))
    current = getattr(tuner, "current", None)
    done = sum(1 for t in list(tuner.history) + list(tuner.final) if t.ok)
    doing = (f", measuring {compact(current.config)} ({current.n} sample{'' if current.n == 1 else 's'})"
             if current is not None else "")
    head = f"{what} during the {phase} phase after {done} finished trial{'' if done == 1 else 's'}{doing}"
    try:
        rec = _partial_record(tuner, start, num_steps, "SIGTERM" if isinstance(e, Terminated) else "SIGINT")
    except Exception as x:  # noqa: BLE001 - the interruption is reported whatever the record does
        return Interrupted(f"{head}; the partial record could not be built ({type(x).__name__}: {x}); every "
                           f"worker was stopped", code)
    if out_path is not None:
        target = out_path
    else:
        from auturi.tuner.cache import resolve_cache_dir

        target = resolve_cache_dir() / f"interrupted-{rec['key']}.json"
    from auturi.tuner.cache import save_record

    try:
        saved = save_record(rec, target)
    except (OSError, ValueError) as x:
        where = f"--out {out}" if out_path is not None else str(target)
        return Interrupted(f"{head}; the partial record could not be written to {where} "
                           f"({getattr(x, 'strerror', None) or x}); every worker was stopped", code)
    return Interrupted(f"{head}; partial record: {saved} (auturi show {saved}); every worker was stopped", code)


def _partial_record(tuner: Any, start: Any, num_steps: int, signame: str) -> dict[str, Any]:
    """The record of what ``tuner`` measured before the interruption: every finished trial,
    the one that was running (``stop_reason`` ``interrupted``), the fastest so far as the
    choice (or the start, when nothing finished), and ``interrupted`` saying when."""
    import copy

    from auturi.tuner.result import TuneResult

    trials, final = list(tuner.history), list(tuner.final)
    current = getattr(tuner, "current", None)
    if current is not None and all(current is not t for t in trials + final):
        running = copy.copy(current)
        running.stop_reason = "interrupted"
        (final if current.source in ("final", "confirm") else trials).append(running)
    best = tuner.best(final) or tuner.best(trials)
    choice = best.config if best is not None else start
    why = (f"interrupted by {signame} during the {tuner.phase} phase: "
           + ("the fastest config measured so far, not re-measured or confirmed; run auturi tune again for a choice"
              if best is not None else "no trial finished; this is the start config, unmeasured"))
    space = tuner.space.sizes() if getattr(tuner, "space", None) is not None else {}
    result = TuneResult(choice=choice, reason=why, trials=trials, final=final, start=start, num_steps=num_steps,
                        strategy=tuner.strategy.info(), space=space, protocol=tuner.protocol.to_dict(),
                        budget={"trials": tuner.budget_trials, "seconds": tuner.budget_seconds},
                        hardware=tuner.hardware, workload=tuner.workload, seconds=tuner.elapsed(),
                        profile_seconds=tuner.profile_seconds, cache_hit=tuner.cached is not None,
                        startup_seconds=getattr(tuner, "startup_seconds", None))
    rec = result.to_record()
    rec["interrupted"] = {"signal": signame, "phase": tuner.phase, "finished_trials": sum(t.ok for t in trials + final),
                          "running": current.config.to_dict() if current is not None else None,
                          "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return rec
