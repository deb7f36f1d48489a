"""Env-parallel scaling microbenchmark (the thesis' Fig. 7.2 setting): CartPole-v1, constant
actions, N = 1, 4, 16, 64 envs.

Compared side by side in one run, rounds interleaved:
- Auturi shm with each env in its own worker (degree N) against SB3 SubprocVecEnv and
  gymnasium AsyncVectorEnv (shared memory);
- Auturi shm with N envs on 2 env workers (degree 2) against SB3 DummyVecEnv;
- Auturi's serial config against DummyVecEnv;
- the CPU used by idle Auturi workers between collects.

Run: python -m bench.envstep [--envs 1 4 16 64] [--steps 2000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import gymnasium as gym
import numpy as np

from bench.common import machine_header, median_spread

ENV_ID = "CartPole-v1"


def make_cartpole():
    return gym.make(ENV_ID)


class AuturiRunner:
    def __init__(self, n: int, degree: int):
        import auturi

        self.cfg = auturi.Config(envs_per_actor=n, env_parallel_degree=degree)
        self.ex = auturi.make_executor(make_cartpole, auturi.ConstantPolicy(gym.spaces.Discrete(2)), num_envs=n,
                                       config=self.cfg, backend="shm")
        self.ex.collect(16)  # warm up: workers started, envs reset

    def run(self, steps: int) -> float:
        r = self.ex.collect(steps)
        return r.stats.steps / r.stats.seconds

    def close(self):
        self.ex.close()


class VecRunner:
    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        if kind == "dummy":
            from stable_baselines3.common.vec_env import DummyVecEnv

            self.env = DummyVecEnv([make_cartpole] * n)
        elif kind == "subproc":
            from stable_baselines3.common.vec_env import SubprocVecEnv

            self.env = SubprocVecEnv([make_cartpole] * n, start_method="forkserver")
        else:
            self.env = gym.vector.AsyncVectorEnv([make_cartpole] * n, shared_memory=True)
        self.env.reset()
        self.actions = np.zeros(n, dtype=np.int64)
        self.run(16)

    def run(self, steps: int) -> float:
        t0 = time.perf_counter()
        if self.kind == "async":
            for _ in range(steps):
                self.env.step(self.actions)
        else:
            for _ in range(steps):
                self.env.step(self.actions)
        return steps * self.n / (time.perf_counter() - t0)

    def close(self):
        self.env.close()


def idle_cpu_percent(n: int, seconds: float = 2.0) -> float:
    """CPU used by an Auturi executor's workers while nobody collects (like a PPO update)."""
    import psutil

    r = AuturiRunner(n, n)
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
    ap.add_argument("--steps", type=int, default=2000, help="total env steps per measurement / N rows")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/envstep.json")
    args = ap.parse_args(argv)
    import stable_baselines3  # noqa: F401  (for the version in the header)
    import torch  # noqa: F401

    results: dict = {"machine": machine_header(), "command": "python -m bench.envstep " + " ".join(argv or sys.argv[1:]),
                     "rows": []}
    print(results["machine"])
    for n in args.envs:
        rows = max(50, args.steps // n)
        makers = {
            "auturi_serial": lambda: AuturiRunner(n, 1),
            "dummy": lambda: VecRunner("dummy", n),
            "auturi_degree_N": lambda: AuturiRunner(n, n),
            "subproc": lambda: VecRunner("subproc", n),
            "async_shm": lambda: VecRunner("async", n),
        }
        if n >= 2:
            makers["auturi_degree_2"] = lambda: AuturiRunner(n, 2)
        samples: dict[str, list[float]] = {k: [] for k in makers}
        runners = {k: m() for k, m in makers.items()}
        try:
            for _ in range(args.rounds):  # interleaved: noise hits every system alike
                for k, r in runners.items():
                    samples[k].append(r.run(rows))
        finally:
            for r in runners.values():
                r.close()
        row = {"n": n, "rows_per_sample": rows}
        for k, xs in samples.items():
            med, spread = median_spread(xs)
            row[k] = {"median": med, "spread": spread, "samples": xs}
        row["ratio_degreeN_vs_subproc"] = row["auturi_degree_N"]["median"] / row["subproc"]["median"]
        row["ratio_degreeN_vs_async"] = row["auturi_degree_N"]["median"] / row["async_shm"]["median"]
        row["ratio_serial_vs_dummy"] = row["auturi_serial"]["median"] / row["dummy"]["median"]
        if n >= 2:
            row["ratio_degree2_vs_dummy"] = row["auturi_degree_2"]["median"] / row["dummy"]["median"]
        results["rows"].append(row)
        print(f"N={n:3d} " + "  ".join(f"{k}={row[k]['median']:9.0f}" for k in samples)
              + "  | " + "  ".join(f"{k}={v:.2f}" for k, v in row.items() if k.startswith("ratio")), flush=True)
    results["idle_worker_cpu_percent_16_workers"] = idle_cpu_percent(16)
    print(f"idle CPU of 16 idle env workers: {results['idle_worker_cpu_percent_16_workers']:.2f}% of one core")
    import os

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print(markdown(results))
    return results


def markdown(results: dict) -> str:
    """The table for docs/benchmarks.md, from the JSON (never typed by hand)."""
    cols = ["auturi_degree_N", "subproc", "async_shm", "auturi_degree_2", "auturi_serial", "dummy"]
    out = [f"Machine: {results['machine']}  ", f"Command: `{results['command']}`", "",
           "| N | " + " | ".join(cols) + " | degN/Subproc | degN/Async | deg2/Dummy | serial/Dummy |",
           "|---:|" + "---:|" * (len(cols) + 4)]
    for row in results["rows"]:
        cells = []
        for c in cols:
            cells.append(f"{row[c]['median']:,.0f} ±{100 * row[c]['spread']:.0f}%" if c in row else "-")
        ratios = [row.get("ratio_degreeN_vs_subproc"), row.get("ratio_degreeN_vs_async"),
                  row.get("ratio_degree2_vs_dummy"), row.get("ratio_serial_vs_dummy")]
        cells += [f"{r:.2f}x" if r is not None else "-" for r in ratios]
        out.append(f"| {row['n']} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(f"Idle CPU of 16 idle env workers between collects: "
               f"{results['idle_worker_cpu_percent_16_workers']:.2f}% of one core.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
