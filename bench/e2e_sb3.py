"""End-to-end time (the thesis' Fig. 7.1): wall seconds of PPO ``learn`` for a fixed number
of steps, SB3's default (DummyVecEnv) against the same model under ``auturi.wrap``, runs
alternated, plus the mean return of the last episodes (learning must not change).

Two Auturi variants: ``tuned`` (``auturi.wrap(model)``, the online tuner, its search
included in the time) and ``fixed`` (``auturi.wrap(model, config=...)`` with the layout
given by ``--config``, e.g. the tuner's choice from bench.tune_quality).

Run: python -m bench.e2e_sb3 [--env CartPole-v1] [--n-envs 8] [--steps 50000] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from bench.common import machine_header


def run(kind: str, env_id: str, n_envs: int, steps: int, seed: int, config_json: str | None,
        n_steps: int = 256) -> dict:
    """One timed ``learn``: ``kind`` is ``sb3`` (SB3's default DummyVecEnv), ``tuned``
    (``auturi.wrap(model)``) or ``fixed`` (``auturi.wrap(model, config=<config_json>)``)."""
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    import auturi

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", make_vec_env(env_id, n_envs=n_envs, seed=seed), n_steps=n_steps, batch_size=256,
                seed=seed, device="cpu", verbose=0)
    if kind == "tuned":
        model = auturi.wrap(model)
    elif kind == "fixed":
        model = auturi.wrap(model, config=auturi.Config.from_json(config_json))
    t0 = time.perf_counter()
    model.learn(steps)
    secs = time.perf_counter() - t0
    ret = float(np.mean([e["r"] for e in list(model.ep_info_buffer)[-50:]])) if model.ep_info_buffer else float("nan")
    chosen = str(model.auturi.config) if kind != "sb3" else "DummyVecEnv"
    if kind != "sb3":
        model.auturi.close()
    return {"kind": kind, "seconds": secs, "return": ret, "layout": chosen}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--n-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", default=None, help="Config JSON for the 'fixed' variant")
    ap.add_argument("--out", default="bench/results/e2e_sb3.json")
    args = ap.parse_args(argv)
    import stable_baselines3  # noqa: F401
    import torch  # noqa: F401

    kinds = ["sb3", "tuned"] + (["fixed"] if args.config else [])
    out = {"machine": machine_header(), "command": "python -m bench.e2e_sb3 " + " ".join(argv or sys.argv[1:]),
           "runs": []}
    print(out["machine"], flush=True)
    for rep in range(args.repeats):
        for kind in kinds:  # alternated: noise hits each alike
            r = run(kind, args.env, args.n_envs, args.steps, seed=rep, config_json=args.config)
            out["runs"].append(r)
            print(f"{kind:6s} seed {rep}: {r['seconds']:7.1f}s  return {r['return']:7.1f}  {r['layout']}", flush=True)
    summary = {}
    for kind in kinds:
        xs = [r for r in out["runs"] if r["kind"] == kind]
        summary[kind] = {"median_seconds": statistics.median(r["seconds"] for r in xs),
                         "mean_return": statistics.mean(r["return"] for r in xs)}
    for kind in kinds[1:]:
        summary[kind]["speedup_vs_sb3"] = summary["sb3"]["median_seconds"] / summary[kind]["median_seconds"]
    out["summary"] = summary
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(summary, indent=1))
    return out


if __name__ == "__main__":
    main()
