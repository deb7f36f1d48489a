"""Env-parallel scaling microbenchmark (the thesis' Fig. 7.2 setting): CartPole-v1, constant
actions, N = 1, 4, 16, 64 envs.

Compared side by side in one run, rounds interleaved:
- Auturi shm with each env in its own worker (degree N) against SB3 SubprocVecEnv and
  gymnasium AsyncVectorEnv (shared memory), and against ``floor`` (bench/floor.py), a bare
  prototype of the same layout without the executor's bookkeeping (``floor_caller``, on
  request: the prototype with its caller stepping one env, as Auturi's actor does);
- Auturi shm with N envs on 2 env workers (degree 2) against SB3 DummyVecEnv;
- Auturi's serial config against DummyVecEnv;
- the CPU used by idle Auturi workers between collects.

Run: python -m bench.envstep [--envs 1 4 16 64] [--steps 10000] [--rounds 5] [--columns ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import gymnasium as gym
from bench.common import interleave, machine_header, summarize
from bench.floor import FloorRunner
from bench.peers import AuturiRunner, PeerRunner

ENV_ID = "CartPole-v1"
COLUMNS = ("auturi_degree_N", "floor", "floor_caller", "subproc", "async_shm", "auturi_degree_2", "auturi_serial", "dummy")
DEFAULT_COLUMNS = tuple(c for c in COLUMNS if c != "floor_caller")
"""``floor_caller`` is asked for by name: a diagnostic (is the actor stepping a share itself
what degree N pays against ``floor``?), not a peer of the bench tables."""


def make_cartpole():
    return gym.make(ENV_ID)


def _constant():
    import auturi

    return auturi.ConstantPolicy(gym.spaces.Discrete(2))


def auturi_runner(n: int, degree: int):
    """An Auturi shm executor on ``n`` CartPoles, ``degree`` stepping contexts, constant actions."""
    import auturi

    return AuturiRunner(make_cartpole, _constant(), n, auturi.Config(envs_per_actor=n, env_parallel_degree=degree))


def vec_runner(kind: str, n: int):
    """A peer (``dummy``, ``subproc``, ``async``) on ``n`` CartPoles with constant actions."""
    return PeerRunner(kind, make_cartpole, n, _constant(), warmup_steps=16)


def makers(n: int, columns=DEFAULT_COLUMNS) -> dict:
    """The runners of one row (N = ``n``), by column name, as constructors."""
    m = {
        "auturi_serial": lambda: auturi_runner(n, 1),
        "dummy": lambda: vec_runner("dummy", n),
        "auturi_degree_N": lambda: auturi_runner(n, n),
        "floor": lambda: FloorRunner(n),
        "floor_caller": lambda: FloorRunner(n, caller_env=True),
        "subproc": lambda: vec_runner("subproc", n),
        "async_shm": lambda: vec_runner("async", n),
    }
    if n >= 2:
        m["auturi_degree_2"] = lambda: auturi_runner(n, 2)
    return {k: v for k, v in m.items() if k in columns}


def measure(ns, steps: int, rounds: int, columns=DEFAULT_COLUMNS, progress=None) -> list[dict]:
    """One row per N: every runner's samples (env steps/s, ``steps // N`` rows per sample, at
    least 50), their summary, and the ratios that exist among ``columns``."""
    rows = []
    for n in ns:
        per = max(50, steps // n)
        runners = {}
        try:
            for k, make in makers(n, columns).items():
                if progress:
                    progress(f"N={n} starting {k}")
                runners[k] = make()
            samples = interleave(runners, rounds, lambda k, r: r.run(per),
                                 (lambda msg: progress(f"N={n} {msg}")) if progress else None)
        finally:
            for r in runners.values():
                r.close()
        row = {"n": n, "rows_per_sample": per}
        row.update({k: summarize(xs) for k, xs in samples.items()})
        for key, a, b in (("ratio_degreeN_vs_floor", "auturi_degree_N", "floor"),
                          ("ratio_degreeN_vs_floor_caller", "auturi_degree_N", "floor_caller"),
                          ("ratio_degreeN_vs_subproc", "auturi_degree_N", "subproc"),
                          ("ratio_degreeN_vs_async", "auturi_degree_N", "async_shm"),
                          ("ratio_serial_vs_dummy", "auturi_serial", "dummy"),
                          ("ratio_degree2_vs_dummy", "auturi_degree_2", "dummy")):
            if a in row and b in row:
                row[key] = row[a]["median"] / row[b]["median"]
        rows.append(row)
    return rows


def idle_cpu_percent(n: int, seconds: float = 2.0) -> float:
    """CPU used by an Auturi executor's workers while nobody collects (like a PPO update)."""
    import psutil

    r = auturi_runner(n, n)
    try:
        procs = [psutil.Process(s.proc.pid) for s in r.ex._slots]
        t0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        time.sleep(seconds)  # benchmark only: measure idle CPU over a wall-clock window
        t1 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        return 100.0 * (t1 - t0) / seconds
    finally:
        r.close()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--steps", type=int, default=10000,
                    help="env steps per sample (N rows of steps // N); short samples (2000) varied ±30%% between rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--columns", nargs="+", choices=COLUMNS, default=list(DEFAULT_COLUMNS),
                    help="runners to measure (default all but floor_caller); e.g. auturi_degree_N floor for the "
                         "per-row ratio alone, plus floor_caller for the prototype with the caller stepping one env")
    ap.add_argument("--out", default="bench/results/envstep.json")
    args = ap.parse_args(argv)
    import stable_baselines3  # noqa: F401  (for the version in the header)
    import torch  # noqa: F401

    results: dict = {"machine": machine_header(), "command": "python -m bench.envstep " + " ".join(argv or sys.argv[1:]),
                     "rows": []}
    print(results["machine"])
    for row in measure(args.envs, args.steps, args.rounds, tuple(args.columns)):
        results["rows"].append(row)
        print(f"N={row['n']:3d} " + "  ".join(f"{k}={row[k]['median']:9.0f}" for k in COLUMNS if k in row)
              + "  | " + "  ".join(f"{k}={v:.2f}" for k, v in row.items() if k.startswith("ratio")), flush=True)
    if "auturi_degree_N" in args.columns:
        results["idle_worker_cpu_percent_16_workers"] = idle_cpu_percent(16)
        print(f"idle CPU of 16 idle env workers: {results['idle_worker_cpu_percent_16_workers']:.2f}% of one core")
    import os

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print(markdown(results))
    return results


def table(rows: list[dict]) -> list[str]:
    """The scaling table's lines (medians, ``±`` half-IQR, ratios), from :func:`measure`'s rows."""
    cols = [c for c in COLUMNS if any(c in row for row in rows)]
    out = ["| N | " + " | ".join(cols) + " | degN/floor | degN/Subproc | degN/Async | deg2/Dummy | serial/Dummy |",
           "|---:|" + "---:|" * (len(cols) + 5)]
    for row in rows:
        cells = [f"{row[c]['median']:,.0f} ±{100 * row[c]['spread']:.0f}%" if c in row else "-" for c in cols]
        ratios = [row.get("ratio_degreeN_vs_floor"), row.get("ratio_degreeN_vs_subproc"), row.get("ratio_degreeN_vs_async"),
                  row.get("ratio_degree2_vs_dummy"), row.get("ratio_serial_vs_dummy")]
        cells += [f"{r:.2f}x" if r is not None else "-" for r in ratios]
        out.append(f"| {row['n']} | " + " | ".join(cells) + " |")
    return out


def markdown(results: dict) -> str:
    """The table for docs/benchmarks.md, from the JSON (never typed by hand)."""
    out = [f"Machine: {results['machine']}  ", f"Command: `{results['command']}`", ""] + table(results["rows"])
    if "idle_worker_cpu_percent_16_workers" in results:
        out.append("")
        out.append(f"Idle CPU of 16 idle env workers between collects: "
                   f"{results['idle_worker_cpu_percent_16_workers']:.2f}% of one core.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
