"""A measured ceiling beside the estimated limit (issue 19 item 5): the workload split evenly
over ``cores`` copies of the serial loop, each in its own process with its share of the envs
and its own policy, run at once with nothing shared and no IPC during a collect. That is the
same work perfectly parallelised, with this machine's real scaling (shared caches, memory
bandwidth, a neighbour's load) in it, which the estimate (``machine_limit``: cores / the CPU
per step) assumes away. Measured in interleaved rounds with the tuned choice (read from a
``python -m bench`` record) and the serial config.

An env that waits (a remote simulator) is not bounded by its cores: for it the copies are no
ceiling (the tuned choice runs more processes than cores), and the estimate's "every env at
once" term is the one to read.

Run: python -m bench.ceiling [--workloads halfcheetah heavytail football] [--record bench/results/bench.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from typing import Any

from bench.common import ChildRates, interleave, machine_header, save_and_print, summarize


def _copy_main(workload: str, num_envs: int, seed: int, conn: Any) -> None:
    """One copy: a serial executor over ``num_envs`` of the workload's envs; collects on
    command and answers with its steps and its start and end times (CLOCK_MONOTONIC, the same
    clock in every process)."""
    import torch

    torch.set_num_threads(1)  # a copy per core: one thread each, as Auturi's actors run
    import auturi
    from bench.workloads import get_workload

    w = get_workload(workload)
    ex = auturi.make_executor(w.make_env(), w.make_policy(), num_envs, config=auturi.Config.serial(num_envs),
                              backend="serial", seed=seed)
    try:
        ex.collect(w.num_steps)  # envs reset, first calls paid
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg is None:
                return
            t0, steps = time.perf_counter(), 0
            for _ in range(msg):
                steps += ex.collect(w.num_steps).stats.steps
            conn.send((steps, t0, time.perf_counter()))
    finally:
        ex.close()


class Copies(ChildRates):
    """``copies`` processes, each the serial loop over ``num_envs / copies`` envs; ``run`` has
    them all collect ``collects`` times at once and returns their steps over the wall time
    from the first start to the last end."""

    kind = "copies"

    def __init__(self, workload: Any, copies: int, collects: int):
        if workload.num_envs % copies:
            raise ValueError(f"{workload.name}: {workload.num_envs} envs do not split over {copies} copies")
        ctx = mp.get_context("forkserver")
        self.collects = collects
        self.conns, self.procs = [], []
        for k in range(copies):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_copy_main, args=(workload.name, workload.num_envs // copies, k, child), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if c.recv() != "ready":
                raise RuntimeError("a copy failed to start")

    def run(self, num_steps: int) -> float:
        return self._rate(self.collects)



class _Repeat:
    """A runner whose sample is ``collects`` runs (as the bench's samples are)."""

    def __init__(self, runner: Any, collects: int):
        self.runner, self.collects = runner, collects

    def run(self, num_steps: int) -> float:
        return sum(self.runner.run(num_steps) for _ in range(self.collects)) / self.collects

    def close(self) -> None:
        self.runner.close()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["halfcheetah", "pong", "heavytail", "largeobs", "football"])
    ap.add_argument("--record", default="bench/results/bench.json", help="the bench record the tuned choices come from")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--collects", type=int, default=3, help="collects per sample")
    ap.add_argument("--out", default="bench/results/ceiling.json")
    args = ap.parse_args(argv)
    from auturi import Config
    from auturi.resources import usable_cores
    from bench.peers import AuturiRunner, LimitProbe
    from bench.workloads import available_workloads

    import torch  # noqa: F401  (versions in the header)

    with open(args.record) as f:
        record = json.load(f)
    tuned = {r["workload"]: r for r in record["collect"]["workloads"]}
    cores = usable_cores()
    out = {"machine": machine_header(), "command": "python -m bench.ceiling " + " ".join(argv or sys.argv[1:]),
           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": cores,
           "record": {"path": args.record, "started": record.get("started"), "note": record.get("note")},
           "workloads": []}
    print(out["machine"], flush=True)
    for w in available_workloads(args.workloads):
        name = w.name
        if name not in tuned:
            print(f"{name}: skipped (no tuned choice in {args.record})")
            continue
        choice = Config.from_dict(tuned[name]["tuned"]["choice"])
        runners: dict[str, Any] = {}
        try:
            runners["copies"] = Copies(w, cores, args.collects)
            runners["auturi_tuned"] = _Repeat(AuturiRunner(w.make_env(), w.make_policy(), w.num_envs, choice,
                                                           warmup_steps=w.num_steps), args.collects)
            probe = LimitProbe(w.make_env(), w.make_policy(), w.num_envs, warmup_steps=w.num_steps)
            runners["serial"] = _Repeat(probe, args.collects)
            samples = interleave(runners, args.rounds, lambda _n, r: r.run(w.num_steps))
            limit = probe.limit(cores, tuned[name]["tuned"].get("inference_profile"))
        finally:
            for r in runners.values():
                r.close()
        peers = {k: summarize(v) for k, v in samples.items()}
        row = {"workload": name, "choice": str(choice), "copies": cores, "envs_per_copy": w.num_envs // cores,
               "peers": peers, "limit": limit,
               "tuned_vs_copies": peers["auturi_tuned"]["median"] / peers["copies"]["median"],
               "tuned_vs_limit": peers["auturi_tuned"]["median"] / limit["steps_per_second"]
               if limit.get("steps_per_second") else None,
               "tuned_vs_envs_only": peers["auturi_tuned"]["median"] / limit["env_steps_per_second"]
               if limit.get("env_steps_per_second") else None}
        out["workloads"].append(row)
        print(f"{name:12s} copies {peers['copies']['median']:10,.0f}  tuned {peers['auturi_tuned']['median']:10,.0f}"
              f"  serial {peers['serial']['median']:10,.0f}  tuned/copies {row['tuned_vs_copies']:.0%}", flush=True)
    return save_and_print(out, args.out, markdown)


def markdown(out: dict) -> str:
    """The table: the measured copies, the tuned choice and serial, and beside them the
    estimated limit (with the inference device it assumes) and the envs-only ceiling (the
    envs alone on the cores, no inference), so a GPU machine's limit, which charges the
    cores only the host side of the GPU's forward passes, reads against what the envs allow."""
    lines = [f"Machine: {out['machine']}  ", f"Command: `{out['command']}` ({out['started']})", "",
             f"| workload | {out['cores']} copies of the serial loop (envs each) | Auturi tuned (its choice) | serial "
             "| tuned / copies | estimated limit (inference on) | tuned / limit | envs only (estimate) | tuned / envs only |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in out["workloads"]:
        p = r["peers"]
        lim = r["limit"].get("steps_per_second")
        dev = r["limit"].get("inference_device") or "cpu"
        est = f"{lim:,.0f} ({dev}) | {r['tuned_vs_limit']:.0%} |" if lim else "- | - |"
        envs = r["limit"].get("env_steps_per_second")
        env_col = f" {envs:,.0f} | {p['auturi_tuned']['median'] / envs:.0%} |" if envs else " - | - |"
        lines.append(f"| {r['workload']} | {p['copies']['median']:,.0f} ({r['envs_per_copy']}) | "
                     f"{p['auturi_tuned']['median']:,.0f} ({r['choice'].replace('|', '/')}) | "
                     f"{p['serial']['median']:,.0f} | "
                     f"**{r['tuned_vs_copies']:.0%}** | " + est + env_col)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
