"""Counts, not timings, of the per-row path at one env per process (issue 19 item 4): Auturi's
degree-N config beside the bare prototype (``bench/floor.py``) over the same number of rows.

Throughput on a small shared VM moves 20-30% between rounds; what a row costs in wake-ups,
syscalls and CPU does not. For each runner this attaches ``perf stat`` (software events and
syscall tracepoints, per thread; no hardware counters needed) to the caller's thread and the
workers, counts exactly ``rows`` rows (perf is enabled and disabled through its control fifo,
so nothing outside the rows is counted) and prints, per row, for the caller and summed over
the workers: context switches, CPU migrations, ``sched_yield``/``futex``/all syscalls and CPU
milliseconds (task-clock). A structural difference (more wake-ups per row, spinning waiters)
shows here however busy the machine is.

Run (root or ``perf_event_paranoid`` <= 1): python -m bench.rowcount [--envs 4 8 16] [--rows 20000]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
import tempfile

EVENTS = ("task-clock", "context-switches", "cpu-migrations", "syscalls:sys_enter_sched_yield",
          "syscalls:sys_enter_futex", "raw_syscalls:sys_enter")
SHORT = {"task-clock": "cpu_us", "context-switches": "cs", "cpu-migrations": "migr",
         "syscalls:sys_enter_sched_yield": "yield", "syscalls:sys_enter_futex": "futex",
         "raw_syscalls:sys_enter": "sysc"}


class PerfCounter:
    """``perf stat`` on threads ``tids``, started disabled; ``enable``/``disable`` block until
    perf acknowledged, so the counts cover exactly what ran in between."""

    def __init__(self, tids: list[int]):
        self.dir = tempfile.mkdtemp(prefix="rowcount_")
        self.ctl, self.ack = os.path.join(self.dir, "ctl"), os.path.join(self.dir, "ack")
        self.out = os.path.join(self.dir, "out")
        os.mkfifo(self.ctl)
        os.mkfifo(self.ack)
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "--per-thread", "-D", "-1", "-e", ",".join(EVENTS),
             "-t", ",".join(map(str, tids)), "-o", self.out, f"--control=fifo:{self.ctl},{self.ack}"],
            stderr=subprocess.DEVNULL)  # its "Events enabled" lines; its counts go to self.out
        self.ctl_f = open(self.ctl, "w")  # opens once perf opened its end
        self.ack_f = open(self.ack)

    def _command(self, cmd: str) -> None:
        self.ctl_f.write(cmd + "\n")
        self.ctl_f.flush()
        got = self.ack_f.readline()
        if got.strip("\0 \n") != "ack":
            raise RuntimeError(f"perf did not acknowledge {cmd!r}: {got!r}")

    def enable(self) -> None:
        self._command("enable")

    def disable(self) -> None:
        self._command("disable")

    def finish(self) -> dict[int, dict[str, float]]:
        """Stop perf; ``{tid: {short event name: count}}`` (task-clock in microseconds)."""
        self.ctl_f.close()
        self.ack_f.close()
        self.proc.send_signal(signal.SIGINT)  # perf stat writes its counts on SIGINT, not on SIGTERM
        self.proc.wait(30)
        counts: dict[int, dict[str, float]] = {}
        with open(self.out) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) < 4 or parts[3] not in SHORT:
                    continue
                tid = int(parts[0].rsplit("-", 1)[1])
                value = float(parts[1]) if parts[1] not in ("", "<not counted>", "<not supported>") else 0.0
                if parts[3] == "task-clock":
                    value *= 1000.0  # msec -> us
                counts.setdefault(tid, {})[SHORT[parts[3]]] = value
        if not counts:
            raise RuntimeError("perf stat counted nothing: run as root or with kernel.perf_event_paranoid <= 1, "
                               "with tracepoints (syscalls:*) available")
        for p in (self.ctl, self.ack, self.out):
            os.unlink(p)
        os.rmdir(self.dir)
        return counts


def worker_pids(runner) -> list[int]:
    if hasattr(runner, "procs"):  # FloorRunner
        return [p.pid for p in runner.procs]
    return [s.proc.pid for s in runner.ex._slots]


def count(runner, rows: int) -> dict[str, dict[str, float]]:
    """Per-row counts of ``rows`` rows of ``runner`` (``run(rows)`` once, after a warm-up):
    ``{"caller": {...}, "workers": {...}}``, the workers' summed."""
    runner.run(64)
    caller, workers = os.getpid(), worker_pids(runner)
    perf = PerfCounter([caller] + workers)
    try:
        perf.enable()
        t0 = time.perf_counter()
        runner.run(rows)
        wall = time.perf_counter() - t0
        perf.disable()
    finally:
        counts = perf.finish()
    out = {"caller": {k: v / rows for k, v in counts.get(caller, {}).items()}, "workers": {}}
    out["caller"]["wall_us"] = 1e6 * wall / rows
    for w in workers:
        for k, v in counts.get(w, {}).items():
            out["workers"][k] = out["workers"].get(k, 0.0) + v / rows
    return out


def makers(n: int, spin: float | None = None) -> dict:
    """The runners of one N; ``spin``: both sides' poll window (None: the default); with 0
    every wait blocks, so the counts are the wake-ups a row needs, with no polling in them."""
    from bench.envstep import auturi_runner
    from bench.floor import FloorRunner
    from auturi.executor.shm.channel import SPIN_SECONDS

    if spin is not None:
        os.environ["AUTURI_SPIN_SECONDS"] = repr(spin)  # read by each new executor
    return {"auturi_degree_N": lambda: auturi_runner(n, n),
            "floor": lambda: FloorRunner(n, SPIN_SECONDS if spin is None else spin)}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--columns", nargs="+", default=["auturi_degree_N", "floor"])
    ap.add_argument("--spin", type=float, default=None, help="poll window of both sides (0: always block)")
    args = ap.parse_args(argv)
    results = []
    keys = ("wall_us", "cs", "migr", "yield", "futex", "sysc", "cpu_us")
    print(f"per row ({args.rows} rows); load {os.getloadavg()[0]:.2f}")
    print(f"{'N':>3} {'runner':16} {'who':7} " + " ".join(f"{k:>8}" for k in keys))
    for n in args.envs:
        for name, make in makers(n, args.spin).items():
            if name not in args.columns:
                continue
            r = make()
            try:
                c = count(r, args.rows)
            finally:
                r.close()
            results.append({"n": n, "runner": name, **c})
            for who in ("caller", "workers"):
                print(f"{n:3d} {name:16} {who:7} " + " ".join(f"{c[who].get(k, 0.0):8.2f}" for k in keys), flush=True)
    return results


if __name__ == "__main__":
    main()
