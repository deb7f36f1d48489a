"""The default one line's online search on the emulated GPU box (issue 32 part 2), end to end:
``online`` (an empty cache, the start serial on the emulated ``cuda`` as SB3's own loop on a
GPU model, the tuner seeing the emulated 16-core box: ``cores=16``) against a ``fixed`` good
layout (1 actor, 16 env lanes, the policy on cuda in the actor), Auturi's ``subproc``-like layout
(a process per env: degree = envs) and the peer itself, ``sb3_subproc``: SB3's SubprocVecEnv
(fork) with the emulated device policy called in this process on a batch of all the envs, as
SB3's PPO ``collect_rollouts`` does with its model on a GPU (what issue 32's ">= 1.0x plain SB3
SubprocVecEnv" compares against), on two step-time profiles. Each system is built, runs
``--collects`` collects of ``--steps`` steps per env, and is timed whole (build, the device
start of every process it starts, collects, reconfigures); the caller's own device start is
paid before the clock starts, as a learner whose model is on the GPU has paid it. For the
online runs it prints which layout each collect ran, what each move cost and when it locked in.

Run: python -m bench.online_gpu [--profiles pong-like straggler] [--collects 8 24] [--steps 128]
     [--time-scale 1] [--context 2.5] [--out bench/results/online_gpu.json]
Numbers are from a 2-core VM emulating the box (see ``auturi.testing``); not a GPU timing.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any


SYSTEMS = ("sb3_subproc", "subproc", "fixed", "online", "online_subproc")
"""``online``: the default one line on a DummyVecEnv-like start (serial, the policy on cuda);
``online_subproc``: on a SubprocVecEnv-like start (a process per env, the policy on cuda)."""
ONLINE = ("online", "online_subproc")


def run_one(kind: str, profile: str, collects: int, args: Any) -> dict:
    from auturi import Config, make_executor
    from auturi.testing.emulated_gpu import emulated_box
    from auturi.tuner import OnlineTuner

    n = args.num_envs
    configs = {"online": Config.serial(n, "cuda"), "fixed": Config(1, n, 16, 1, "cuda", n),
               "subproc": Config(1, n, n, 1, "cuda", n), "online_subproc": Config(1, n, n, 1, "cuda", n)}
    rows: list[dict] = []
    with emulated_box(profile, time_scale=args.time_scale, context_seconds=args.context) as box:
        policy = box.policy()
        policy.to("cuda")  # the learner's device start, paid before training (untimed, every system)
        if kind == "sb3_subproc":
            return _sb3_subproc(box, policy, profile, collects, args)
        t0 = time.perf_counter()
        with make_executor(box.env, policy, num_envs=n, config=configs[kind], backend="shm", seed=0) as ex:
            tuner = OnlineTuner(ex, cache=False, cores=args.cores) if kind.startswith("online") else None
            if tuner is not None:
                tuner.begin(args.steps)  # as the SB3 face does at wrap time (timed: inside total)
            for i in range(collects):
                cfg, c0 = ex.config, time.perf_counter()
                moves = len(tuner.reconfigures) if tuner else 0
                if tuner is not None:
                    tuner.collect(args.steps, remaining_collects=collects - 1 - i)
                else:
                    ex.collect(args.steps)
                rows.append({"collect": i, "config": str(cfg), "seconds": time.perf_counter() - c0,
                             "phase": tuner.phase if tuner else None,
                             "move_seconds": sum(r["seconds"] for r in tuner.reconfigures[moves:]) if tuner else 0.0})
            total = time.perf_counter() - t0
            out = {"system": kind, "profile": profile, "collects": collects, "seconds": total, "rows": rows,
                   "steps": collects * args.steps * n}
            if tuner is not None:
                out["first_run"] = tuner.first_run_cost()
                out["locked"] = str(tuner.locked_config)
                out["reconfigures"] = tuner.reconfigures
    return out


def _sb3_subproc(box: Any, policy: Any, profile: str, collects: int, args: Any) -> dict:
    """SB3's SubprocVecEnv and the emulated device policy in this process, timed as the others."""
    from bench.peers import PeerRunner

    t0 = time.perf_counter()
    runner = PeerRunner("subproc", box.env, args.num_envs, policy)
    try:
        rows = []
        for i in range(collects):
            c0 = time.perf_counter()
            runner.run(args.steps)
            rows.append({"collect": i, "config": "SB3 SubprocVecEnv", "seconds": time.perf_counter() - c0})
    finally:
        runner.close()
    total = time.perf_counter() - t0
    return {"system": "sb3_subproc", "profile": profile, "collects": collects, "seconds": total, "rows": rows,
            "steps": collects * args.steps * args.num_envs}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["pong-like", "straggler"])
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--collects", type=int, nargs="+", default=[8, 24],
                    help="run lengths in collects (8 and 24 of 128 steps x 32 envs: the GPU record's 32k and 98k)")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--context", type=float, default=2.5, help="the emulated CUDA start per process, seconds")
    ap.add_argument("--cores", type=int, default=16, help="the cores the online tuner plans for")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS,
                    help="which systems to run (sb3_subproc and subproc are the ratios' bases: kept)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    systems = [k for k in SYSTEMS if k in {*args.systems, "sb3_subproc", "subproc"}]
    import torch  # noqa: F401 - an SB3 user's process has it: the tuner's hardware key reads it, untimed there

    # Untimed: the first executor of a process starts the env workers' forkserver (its imports),
    # which every later one reuses; without this, whichever system ran first paid it.
    run_one("subproc", args.profiles[0], 1, args)
    results = [run_one(kind, p, c, args) for p in args.profiles for c in args.collects
               for kind in systems]
    for p, collects in [(p, c) for p in args.profiles for c in args.collects]:
        by = {r["system"]: r for r in results if r["profile"] == p and r["collects"] == collects}
        sb3, sub = by["sb3_subproc"]["seconds"], by["subproc"]["seconds"]
        print(f"\n## {p}: {args.num_envs} envs, {collects} collects x {args.steps} steps")
        print("| system | seconds | steps/s | vs SB3 SubprocVecEnv | vs Auturi's subproc-like |\n"
              "|---|---:|---:|---:|---:|")
        for k in systems:
            r = by[k]
            print(f"| {k} | {r['seconds']:.2f} | {r['steps'] / r['seconds']:,.0f} | {sb3 / r['seconds']:.2f}x | "
                  f"{sub / r['seconds']:.2f}x |")
        for name in (k for k in ONLINE if k in systems):
            _moves(name, by[name])
    out = {"args": vars(args), "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


def _moves(name: str, on: dict) -> None:
    """The online run's table: which layout each collect ran, the moves, the lock-in."""
    first = {k: round(v, 2) if isinstance(v, float) else v for k, v in on["first_run"].items()}
    print(f"\n{name} moves (locked in: {on['locked']}, first_run: {json.dumps(first)})")
    print("| collect | layout it ran | seconds | move seconds in it | phase after |\n|---:|---|---:|---:|---|")
    for row in on["rows"]:
        print(f"| {row['collect']} | {row['config']} | {row['seconds']:.2f} | {row['move_seconds']:.2f} | "
              f"{row['phase']} |")


if __name__ == "__main__":
    main()
