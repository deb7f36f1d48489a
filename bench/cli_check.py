"""Does ``auturi tune`` print speed-ups a second look confirms?

For each workload: run the CLI (``python -m auturi.cli tune``, a subprocess, as a user
would) with a non-serial ``--start``; read the speed-ups it printed over serial and over the
start config; then, in a fresh process, build the same env and policy, one executor per
config (choice, start, serial), and measure them interleaved, after one warm-up collect
each: each round one sample of each, taken as the CLI's confirm rounds take theirs (at least
50 ms, and at least as many collects as the CLI's confirm used for that config, more if the
spread seen here calls for more: :func:`auturi.tuner.measure.collects_per_sample`), so both
estimate the same quantity (the median of samples long enough to hold the rare slow steps).
The check passes when both re-measured ratios (medians of the samples) are within
``--tolerance`` (10%) of the printed ones.

Workloads, of different kinds: ``cartpole`` (a cheap classic env: IPC dominates),
``slow`` (SlowEnv, ~1 ms per step: parallel envs pay), ``heavytail`` (HeavyTailEnv, rare
50x steps: the samples have outliers).

Run: python -m bench.cli_check [--workloads cartpole slow heavytail] [--budget 20] [--rounds 7]
[--out bench/results/cli_check.json]. Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# name: (ENV as the CLI takes it, --num-envs, --num-steps, --start)
WORKLOADS = {
    "cartpole": ("CartPole-v1", 8, 64, "num_actors=2"),
    "slow": ("bench.workloads:make_slow", 8, 32, "num_actors=2"),
    "heavytail": ("bench.workloads:make_heavytail", 8, 64, "num_actors=2"),
}
SAMPLE_SECONDS_CAP = 1.0
"""Seconds one re-measure sample may grow to (a busy machine's spread would grow it to 64
collects: minutes per workload)."""
_SERIAL = re.compile(r"; ([\d.]+)x serial")
_START = re.compile(r"^\s+([\d.]+)x the start config", re.MULTILINE)


def run_cli(name: str, budget: float, out_dir: Path) -> dict:
    """``auturi tune`` on workload ``name``; its printed speed-ups, record and wall time."""
    env, n, steps, start = WORKLOADS[name]
    record = out_dir / f"cli_check_{name}.json"
    cmd = [sys.executable, "-m", "auturi.cli", "tune", env, "--num-envs", str(n), "--num-steps", str(steps),
           "--start", start, "--budget-seconds", str(budget), "--no-cache", "--out", str(record)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False,
                          env=dict(os.environ, COLUMNS="200"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"auturi tune {env} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    ser, sta = _SERIAL.search(proc.stdout), _START.search(proc.stdout)
    rec = json.loads(record.read_text())
    return {"command": " ".join(cmd[2:]), "stdout": proc.stdout, "wall_seconds": wall, "record": rec,
            "printed_vs_serial": float(ser.group(1)) if ser else None,
            "printed_vs_start": float(sta.group(1)) if sta else None}


def remeasure(name: str, configs: dict, rounds: int, collects: dict | None = None) -> dict[str, list[float]]:
    """Fresh executors for ``configs`` (name -> Config dict), measured interleaved: each
    round one sample of each (after one warm-up collect each), taken as the tuner's confirm
    rounds take theirs: collects back to back for at least 50 ms and at least ``collects[name]``
    of them, more once the spread of the collects seen here calls for more."""
    import auturi
    from auturi.cli import _probe_spaces, build_policy, resolve_env_spec
    from auturi.tuner.measure import Trial, collects_per_sample, regroup, sample_throughput
    from bench.common import interleave

    env, n, steps, _ = WORKLOADS[name]
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    env_obj = resolve_env_spec(env)
    policy, _ = build_policy("auto", *_probe_spaces(env_obj))
    executors = {}
    try:
        for key, cfg in configs.items():
            ex = auturi.make_executor(env_obj, policy, n, auturi.Config.from_dict(cfg), backend="shm", seed=0)
            executors[key] = ex
            ex.collect(steps)  # warm-up
        seen: dict[str, list[float]] = {key: [] for key in executors}
        sizes: dict[str, list[int]] = {key: [] for key in executors}
        length = {key: int((collects or {}).get(key, 1)) for key in executors}

        def sample(key, ex):
            # As the confirm rounds grow theirs, and as they are capped (by the budget there): here
            # at the CLI's length or SAMPLE_SECONDS_CAP of collects, whichever is more.
            mean_collect = steps * n * statistics.fmean(1.0 / r for r in seen[key]) if seen[key] else 0.0
            cap = max(length[key], int(SAMPLE_SECONDS_CAP / mean_collect) if mean_collect > 0 else length[key])
            length[key] = max(length[key], min(cap, collects_per_sample(seen[key])))
            before = len(seen[key])
            sps = sample_throughput(ex, steps, steps * n, 0.05, time.perf_counter, min_collects=length[key],
                                    collect_rates=seen[key])
            sizes[key].append(len(seen[key]) - before)
            return sps

        samples = interleave(executors, rounds, sample)
        for key in samples:  # samples taken before the length grew are regrouped, as the confirm's are
            tr = Trial(config=auturi.Config.from_dict(configs[key]), samples=samples[key], status="ok",
                       collect_rates=seen[key], sample_collects=sizes[key], collects_per_sample=length[key])
            regroup(tr)
            samples[key] = tr.samples
        return {**samples, "_collects_per_sample": length}
    finally:
        for ex in executors.values():
            ex.close()


def check(name: str, budget: float, rounds: int, tolerance: float, out_dir: Path) -> dict:
    cli = run_cli(name, budget, out_dir)
    rec = cli["record"]
    serial = {"num_actors": 1, "envs_per_actor": WORKLOADS[name][1], "env_parallel_degree": 1,
              "policies_per_actor": 1, "policy_device": "cpu", "policy_batch_size": WORKLOADS[name][1]}
    configs = {"choice": rec["choice"]["config"], "start": rec["start"], "serial": serial}
    # A config equal to another is measured once (the same executor would be measured twice).
    unique = {}
    for key, cfg in configs.items():
        if cfg not in unique.values():
            unique[key] = cfg
    # In a fresh process: nothing of the CLI's (imports, forkservers, caches) carries over.
    lengths = confirm_lengths(rec)
    collects = {key: lengths.get(_label(cfg), 1) for key, cfg in unique.items()}
    code = ("import json, sys; from bench.cli_check import remeasure; "
            f"print(json.dumps(remeasure({name!r}, json.loads(sys.argv[1]), {rounds}, json.loads(sys.argv[2]))))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(unique), json.dumps(collects)], cwd=REPO,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"re-measure of {name} failed: {proc.stderr[-2000:]}")
    samples = json.loads(proc.stdout.strip().splitlines()[-1])
    remeasure_collects = samples.pop("_collects_per_sample")
    med = {key: statistics.median(samples[next(k for k, c in unique.items() if c == cfg)])
           for key, cfg in configs.items()}
    row = {"workload": name, "choice": rec["choice"]["config"], "start": rec["start"],
           "printed_vs_serial": cli["printed_vs_serial"], "printed_vs_start": cli["printed_vs_start"],
           "remeasured_vs_serial": med["choice"] / med["serial"], "remeasured_vs_start": med["choice"] / med["start"],
           "medians": med, "samples": samples, "cli_collects_per_sample": collects,
           "remeasure_collects_per_sample": remeasure_collects, "cli_wall_seconds": cli["wall_seconds"],
           "startup": rec.get("startup"), "tune_seconds": rec.get("seconds"), "command": cli["command"],
           "cli_stdout": cli["stdout"]}
    for k in ("serial", "start"):
        printed, again = row[f"printed_vs_{k}"], row[f"remeasured_vs_{k}"]
        if printed is None and configs["choice"] == configs[k]:
            printed = 1.0  # the CLI prints no ratio of a config to itself
        row[f"diff_vs_{k}"] = None if printed is None else again / printed - 1
    row["ok"] = all(row[f"diff_vs_{k}"] is not None and abs(row[f"diff_vs_{k}"]) <= tolerance
                    for k in ("serial", "start"))
    return row


def _label(cfg: dict) -> str:
    from auturi import Config

    return str(Config.from_dict(cfg))


def confirm_lengths(rec: dict) -> dict[str, int]:
    """Collects per sample of each config in the CLI's confirm rounds (by the config's text),
    as its record keeps them."""
    return {_label(t["config"]): int(t.get("collects_per_sample", 1)) for t in rec.get("final", [])
            if t.get("source") == "confirm"}


def table(rows: list[dict]) -> str:
    def pct(x):
        return "-" if x is None else f"{x:+.1%}"

    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    out = ["| workload | choice | printed x serial | re-measured | diff | printed x start | re-measured | diff | "
           "start-up s | tune s | ok |", "|" + "---|" * 11]
    for r in rows:
        c = r["choice"]
        label = (f"{c['num_actors']}x{c['envs_per_actor']} d{c['env_parallel_degree']} "
                 f"p{c['policies_per_actor']} b{c['policy_batch_size']}")
        st = (r.get("startup") or {}).get("to_first_measurement_seconds")
        out.append(f"| {r['workload']} | {label} | {x(r['printed_vs_serial'])} | {x(r['remeasured_vs_serial'])} | "
                   f"{pct(r['diff_vs_serial'])} | {x(r['printed_vs_start'])} | {x(r['remeasured_vs_start'])} | "
                   f"{pct(r['diff_vs_start'])} | {'-' if st is None else f'{st:.1f}'} | "
                   f"{r['tune_seconds']:.1f} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--budget", type=float, default=20.0, help="--budget-seconds of each auturi tune run")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the re-measure")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cli_check.json")
    args = ap.parse_args(argv)
    out_dir = args.out.resolve().parent
    rows = []
    load0 = os.getloadavg()[0]
    for name in args.workloads:
        print(f"cli_check {name}: auturi tune, then the re-measure", flush=True)
        rows.append(check(name, args.budget, args.rounds, args.tolerance, out_dir))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    from bench.common import machine_header

    res = {"machine": machine_header(), "load_average_1min": [load0, os.getloadavg()[0]],
           "tolerance": args.tolerance, "rounds": args.rounds, "budget_seconds": args.budget, "rows": rows}
    args.out.write_text(json.dumps(res, indent=1))
    print(f"\nMachine: {res['machine']}; 1-min load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end\n")
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
