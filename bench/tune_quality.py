"""Tuner quality: for each workload, the grid's best (every point measured to the protocol)
against the ``model`` and ``optuna`` strategies; then the three choices, the serial config
and the peers (SB3 DummyVecEnv and SubprocVecEnv with the same policy) re-measured
interleaved in the same run.

Reported per workload: throughput of each choice as a fraction of the grid's best, tuning
seconds as a fraction of the grid's, and the choice against serial and the best peer.

Run: python -m bench.tune_quality [--workloads cartpole slow heavytail] [--out ...]
"""
from __future__ import annotations

import argparse
import sys
import time

from bench.common import interleave, machine_header, median_spread, save_and_print


def tune(workload, strategy: str, **kw):
    from auturi.tuner import Tuner

    ex = workload.make_executor(backend="shm")
    try:
        t0 = time.perf_counter()
        result = Tuner(strategy=strategy, cache=False, seed=0, **kw).tune(ex, workload.num_steps)
        return result, time.perf_counter() - t0
    finally:
        ex.close()


def final_round(workload, configs: dict, rounds: int, peers=("dummy", "subproc"), progress=None) -> dict:
    """Re-measure the chosen configs and the peers, interleaved, on fresh executors.
    Returns ``(median, spread, samples)`` by name."""
    from bench.peers import AuturiRunner, make_workload_peer

    runners: dict = {}
    try:
        for name, cfg in configs.items():
            runners[name] = AuturiRunner(workload.make_env(), workload.make_policy(), workload.num_envs, cfg,
                                         warmup_steps=workload.num_steps)
        for k in peers:
            runners[k] = make_workload_peer(k, workload, warmup_steps=workload.num_steps // 4)
        samples = interleave(runners, rounds, lambda name, r: r.run(workload.num_steps), progress)
    finally:
        for r in runners.values():
            r.close()
    return {k: median_spread(v) + (v,) for k, v in samples.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["cartpole", "slow", "heavytail"])
    ap.add_argument("--optuna-trials", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--max-samples", type=int, default=6)
    ap.add_argument("--out", default="bench/results/tune_quality.json")
    args = ap.parse_args(argv)
    from auturi import Config
    from bench.workloads import available_workloads

    import torch  # noqa: F401  (versions in the header)
    import stable_baselines3  # noqa: F401

    out = {"machine": machine_header(), "command": "python -m bench.tune_quality " + " ".join(argv or sys.argv[1:]),
           "workloads": []}
    print(out["machine"], flush=True)
    for w in available_workloads(args.workloads):
        name = w.name
        row: dict = {"workload": name, "num_envs": w.num_envs, "num_steps": w.num_steps}
        proto = {"max_samples": args.max_samples}
        res = {}
        for strat, kw in (("grid", {}), ("model", {}), ("optuna", {"budget_trials": args.optuna_trials})):
            r, secs = tune(w, strat, **proto, **kw)
            res[strat] = r
            row[strat] = {"choice": r.choice.to_dict(), "seconds": secs, "trials": len(r.trials),
                          "tuned_throughput": r.throughput}
            print(f"{name:10s} {strat:7s} {secs:7.1f}s {len(r.trials):3d} trials -> {r.choice} "
                  f"({r.throughput:,.0f} steps/s)", flush=True)
        configs = {s: res[s].choice for s in res}
        configs["serial"] = Config.serial(w.num_envs)
        final = final_round(w, configs, args.rounds)
        row["final"] = {k: {"median": m, "spread": sp, "samples": xs} for k, (m, sp, xs) in final.items()}
        grid_best = final["grid"][0]
        best_peer = max(final["dummy"][0], final["subproc"][0])
        for s in ("model", "optuna"):
            row[s]["fraction_of_grid_best"] = final[s][0] / grid_best
            row[s]["fraction_of_grid_seconds"] = row[s]["seconds"] / row["grid"]["seconds"]
        for s in ("grid", "model", "optuna"):
            row[s]["vs_serial"] = final[s][0] / final["serial"][0]
            row[s]["vs_best_peer"] = final[s][0] / best_peer
        out["workloads"].append(row)
        print(f"{name:10s} model: {row['model']['fraction_of_grid_best']:.2f} of grid best for "
              f"{row['model']['fraction_of_grid_seconds']:.2f} of its time; vs serial "
              f"{row['model']['vs_serial']:.2f}x, vs best peer {row['model']['vs_best_peer']:.2f}x", flush=True)
    return save_and_print(out, args.out, markdown)


def markdown(out: dict) -> str:
    lines = [f"Machine: {out['machine']}  ", f"Command: `{out['command']}`", "",
             "| workload | strategy | choice | trials | tuning s | of grid best | of grid time | vs serial | vs best peer |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    from auturi import Config

    for row in out["workloads"]:
        for s in ("grid", "model", "optuna"):
            r = row[s]
            frac = f"{r['fraction_of_grid_best']:.2f}" if "fraction_of_grid_best" in r else "1.00"
            tfrac = f"{r['fraction_of_grid_seconds']:.2f}" if "fraction_of_grid_seconds" in r else "1.00"
            cfg = str(Config.from_dict(r["choice"])).replace("|", "\\|")  # its separators would split the cell
            lines.append(f"| {row['workload']} | {s} | {cfg} | {r['trials']} | "
                         f"{r['seconds']:.0f} | {frac} | {tfrac} | {r['vs_serial']:.2f}x | {r['vs_best_peer']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
