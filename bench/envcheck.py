"""What checking every env step costs (issue 30 item 3): collect throughput of the serial
layout with the per-step checks (the default) against the same executor checking only each
env's first reset and first step (``EnvRunner.check_steps = False``, the behaviour before
2026-11-26), rounds interleaved and the order rotated each round; plus, when the executor takes
it, ``check_finite=True``.

On a machine others load, time is noisy (±10-20% between rounds on a shared 2-core VM), so
``--instructions`` also counts the instructions each variant executes per env step, with
valgrind's cachegrind (deterministic; slow: minutes): two collects' counts per variant,
of ``--instruction-rows`` rows apart, so start-up cancels out.

The serial layout shows the checks' cost at its largest: nothing but env steps and a constant
policy share the process (in the other layouts each step also pays IPC, so the same
nanoseconds are a smaller share). Workloads: CartPole-v1 (16 envs, the cheapest step there is)
and HalfCheetah-v5 (8 envs, when mujoco is installed).

Run: python -m bench.envcheck [--rounds 9] [--steps 20000] [--workloads cartpole halfcheetah]
                              [--instructions] [--instruction-rows 1000]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import gymnasium as gym

from bench.common import machine_header, paired_ratios, rotated, save_and_print, summarize

WORKLOADS = {
    # name: (env id, envs, what it needs)
    "cartpole": ("CartPole-v1", 16, None),
    "halfcheetah": ("HalfCheetah-v5", 8, "mujoco"),
}
VARIANTS = ("checked", "first_only", "check_finite")


def make_variant(env_id: str, n: int, variant: str, **kw):
    """A serial executor on ``n`` envs ``env_id`` with a constant policy, checking as
    ``variant`` says (``kw``: more executor options); None when this executor does not take
    ``check_finite`` yet."""
    import auturi

    space = gym.make(env_id).action_space
    if variant == "check_finite":
        kw["check_finite"] = True
    try:
        ex = auturi.make_executor(env_id, auturi.ConstantPolicy(space), num_envs=n, backend="serial", seed=0, **kw)
    except TypeError:
        if variant == "check_finite":
            return None
        raise
    if variant == "first_only":
        ex._envs.check_steps = False  # before the first step: every env steps aside after it
    ex.collect(64)  # first resets and steps, caches warm
    return ex


def sample(ex, rows: int) -> tuple[float, float]:
    """Env steps per wall second and per CPU second of this process, of one collect of
    ``rows`` rows. On a machine others share, CPU time is the steadier measure of what the
    checks cost (it leaves out the time this process waited for a core)."""
    t0, c0 = time.perf_counter(), time.process_time()
    ex.collect(rows)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = rows * ex.num_envs
    return steps / wall, steps / max(cpu, 1e-9)


def measure(name: str, rounds: int, steps: int) -> dict:
    env_id, n, _ = WORKLOADS[name]
    rows = max(64, steps // n)
    exs = {v: make_variant(env_id, n, v) for v in VARIANTS}
    exs = {v: ex for v, ex in exs.items() if ex is not None}
    samples: dict[str, list[tuple[float, float]]] = {v: [] for v in exs}
    try:
        for k in range(rounds):
            for v in rotated(list(exs), k):
                samples[v].append(sample(exs[v], rows))
    finally:
        for ex in exs.values():
            ex.close()
    row: dict = {"workload": name, "env": env_id, "num_envs": n, "rows_per_sample": rows}
    for clock, j in (("wall", 0), ("cpu", 1)):
        row[clock] = {v: summarize([x[j] for x in xs]) for v, xs in samples.items()}
        by_round = {v: {r: x[j] for r, x in enumerate(xs)} for v, xs in samples.items()}
        for v in exs:
            if v == "first_only":
                continue
            row[clock][f"ratio_{v}"] = paired_ratios(by_round[v], by_round["first_only"])
            # what the check costs per env step, from the medians
            med, base = row[clock][v]["median"], row[clock]["first_only"]["median"]
            row[clock][f"ns_per_step_{v}"] = 1e9 * (1 / med - 1 / base)
    return row


def _instruction_run(variant: str, name: str, rows: int) -> int:
    """Instructions (cachegrind's ``I refs``) of a process that builds the ``variant``
    executor of workload ``name``, collects 8 rows, then ``rows`` more, and closes."""
    env_id, n, _ = WORKLOADS[name]
    # No watchdog thread (worker_timeout=inf: its wakes per second would count more under
    # valgrind's slowdown, by run length), no spinning BLAS threads (they count by time too)
    # and one hash seed: the counts then repeat.
    code = ("import math; from bench.envcheck import make_variant; "
            f"ex = make_variant({env_id!r}, {n}, {variant!r}, worker_timeout=math.inf); ex.collect({rows}); ex.close()")
    out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                              "MKL_NUM_THREADS": "1"},
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"valgrind run failed: {out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def instructions(name: str, rows: int) -> dict:
    """Instructions per env step of each variant (the difference of two runs ``rows`` rows
    apart, divided by the steps between them), and the other variants' ratios to
    ``first_only``."""
    env_id, n, _ = WORKLOADS[name]
    variants = ["first_only", "checked"]
    probe = make_variant(env_id, n, "check_finite")
    if probe is not None:  # this executor takes check_finite
        probe.close()
        variants.append("check_finite")
    per = {v: (_instruction_run(v, name, 8 + rows) - _instruction_run(v, name, 8)) / (rows * n) for v in variants}
    out = {"rows": rows, "per_step": per}
    for v in variants[1:]:
        out[f"ratio_{v}"] = per[v] / per["first_only"]
        out[f"extra_per_step_{v}"] = per[v] - per["first_only"]
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (0: instructions only)")
    ap.add_argument("--steps", type=int, default=20000, help="env steps per sample (rows = steps // envs)")
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions per step with valgrind (deterministic under load; minutes)")
    ap.add_argument("--instruction-rows", type=int, default=1000)
    ap.add_argument("--out", default="bench/results/envcheck.json")
    args = ap.parse_args(argv)
    if args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind (apt-get install valgrind)")
    out: dict = {"machine": machine_header(), "command": "python -m bench.envcheck " + " ".join(argv or sys.argv[1:]),
                 "rows": [], "skipped": []}
    print(out["machine"], flush=True)
    for name in args.workloads:
        needs = WORKLOADS[name][2]
        if needs and importlib.util.find_spec(needs) is None:
            out["skipped"].append(f"{name}: {needs} is not installed")
            continue
        env_id, n, _ = WORKLOADS[name]
        row = measure(name, args.rounds, args.steps) if args.rounds else {"workload": name, "env": env_id, "num_envs": n}
        if args.instructions:
            row["instructions"] = instructions(name, args.instruction_rows)
        out["rows"].append(row)
        print(" ".join(_cells(row)), flush=True)
    return save_and_print(out, args.out, markdown)


def _cells(row: dict) -> list[str]:
    cells = [f"{row['workload']} (N={row['num_envs']}):"]
    for clock in ("wall", "cpu") if "wall" in row else ():
        r = row[clock]
        cells.append(f"[{clock}] " + " ".join(f"{v}={r[v]['median']:,.0f}/s" for v in VARIANTS if v in r))
        for v in ("checked", "check_finite"):
            p = r.get(f"ratio_{v}")
            if p:
                cells.append(f"{v}/first_only={p['geomean']:.3f} [{p['min']:.3f}-{p['max']:.3f}] "
                             f"({r[f'ns_per_step_{v}']:+.0f} ns a step)")
    ins = row.get("instructions")
    if ins:
        cells.append("[instructions] " + " ".join(f"{v}={x:,.0f}/step" for v, x in ins["per_step"].items())
                     + " " + " ".join(f"{k}={x:.4f}" for k, x in ins.items() if k.startswith("ratio")))
    return cells


def markdown(out: dict) -> str:
    """The table for docs/benchmarks.md, from the JSON (never typed by hand)."""
    lines = [f"Machine: {out['machine']}  ", f"Command: `{out['command']}`", "",
             "Steps per second of wall time and of this process's CPU time (medians, ± half-IQR); ratios are "
             "the geometric mean [min-max] of each round's ratio to `first_only` in the same round.", "",
             "| workload | clock | first step only | every step | every step, check_finite | every step / first only "
             "| check_finite / first only | cost a step |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in out["rows"]:
        for clock in ("wall", "cpu") if "wall" in row else ():
            r = row[clock]

            def med(v):
                return f"{r[v]['median']:,.0f} ±{100 * r[v]['spread']:.0f}%" if v in r else "-"

            def ratio(v):
                p = r.get(f"ratio_{v}")
                return f"{p['geomean']:.3f}x [{p['min']:.3f}-{p['max']:.3f}]" if p else "-"

            lines.append(f"| {row['workload']} ({row['num_envs']} envs) | {clock} | {med('first_only')} | "
                         f"{med('checked')} | {med('check_finite')} | {ratio('checked')} | {ratio('check_finite')} | "
                         f"{r['ns_per_step_checked']:+.0f} ns |")
    counted = [row for row in out["rows"] if "instructions" in row]
    if counted:
        lines += ["", "Instructions per env step (valgrind cachegrind; deterministic):", "",
                  "| workload | first step only | every step | ratio | extra a step | every step, check_finite | ratio "
                  "| extra a step |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for row in counted:
            ins, per = row["instructions"], row["instructions"]["per_step"]
            cells = [f"{per['first_only']:,.0f}"]
            for v in ("checked", "check_finite"):
                cells += ([f"{per[v]:,.0f}", f"{ins[f'ratio_{v}']:.4f}x", f"{ins[f'extra_per_step_{v}']:,.0f}"]
                          if v in per else ["-", "-", "-"])
            lines.append(f"| {row['workload']} | " + " | ".join(cells) + " |")
    lines += [f"Skipped: {s}" for s in out["skipped"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
