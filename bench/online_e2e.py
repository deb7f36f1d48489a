"""Does online tuning pay for itself? PPO ``learn`` end to end, plain SB3 against
``auturi.wrap(model)`` (the default: online tuning) and ``auturi.wrap(model, config=<offline
choice>)``, on workloads of different kinds, runs alternated, every run in a fresh process.

Variants, per workload, seed and length:

- ``sb3``: plain SB3 (``make_vec_env``'s DummyVecEnv, as users get it);
- ``fresh``: ``auturi.wrap(model)`` with an empty tuner cache;
- ``warm``: the same, with the cache the ``fresh`` run of that seed left behind;
- ``fixed``: ``auturi.wrap(model, config=...)`` with the layout the offline tuner chose for
  the workload (measured once per workload, before the runs, on the wrapped model's own
  executor; its time is not counted);
- ``subproc`` and ``fresh_subproc`` (asked for by name): plain SB3 on a ``SubprocVecEnv``, and
  ``auturi.wrap`` of that model with an empty cache (the SubprocVecEnv user adding the line;
  its search starts from an env worker per env); the second is compared with the first. The
  VecEnv's workers start while the model is built, outside the timing; ``wrap``'s own are timed.

Lengths are in seconds of plain SB3 (``--lengths 30 120``): a first short plain run per
workload measures SB3's rate and sets the timesteps of each length.

Reported per workload and length: median wall seconds of ``wrap`` + ``learn`` (a fixed
config starts its processes in ``wrap``; plain SB3's model is built outside the timing, as
every variant's is) and the ratio of each
variant to ``sb3`` (above 1 = faster), episodes logged, mean return of the last 20 episodes,
and the online tuner's record (phase at the end, trials, the choice).

Run: python -m bench.online_e2e [--quick] [--workloads cartpole,cpuheavy] [--seeds 2]
     [--lengths 30 120] [--out bench/results/online_e2e.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from bench.common import machine_header, paired_ratios, rotated


# ---------------------------------------------------------------------------- workloads
def make_cpuheavy():
    from auturi.envs import HeavyTailEnv

    return HeavyTailEnv(base_seconds=2e-4, tail_prob=0.0)  # ~0.2 ms of CPU per step, no tail


def make_remote():
    from auturi.envs import SlowEnv

    return SlowEnv()  # ~1 ms spent waiting per step, as on a simulator in another process or host


def make_bimodal():
    from auturi.envs import HeavyTailEnv

    return HeavyTailEnv(base_seconds=5e-5, tail_prob=0.1, tail_factor=20.0)  # 1 step in 10 costs 20x


@dataclass(frozen=True)
class E2EWorkload:
    name: str
    kind: str
    env: str | Callable[[], Any]
    n_envs: int = 16
    n_steps: int = 64
    policy_kwargs: dict | None = None


WORKLOADS = {
    "cartpole": E2EWorkload("cartpole", "cheap classic-control env", "CartPole-v1"),
    "cpuheavy": E2EWorkload("cpuheavy", "CPU-heavy env (0.2 ms of compute per step)", make_cpuheavy),
    "bimodal": E2EWorkload("bimodal", "bimodal step latency (1 in 10 steps 20x)", make_bimodal),
    "halfcheetah": E2EWorkload("halfcheetah", "MuJoCo HalfCheetah-v5", "HalfCheetah-v5", n_envs=8, n_steps=128),
    "remote": E2EWorkload("remote", "a remote simulator (1 ms waiting per step)", make_remote),
    "bignet": E2EWorkload("bignet", "large policy network (3x1024 MLP) on CartPole", "CartPole-v1",
                          policy_kwargs={"net_arch": [1024, 1024, 1024]}),
}


def _model(w: E2EWorkload, seed: int, subproc: bool = False):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    torch.set_num_threads(1)  # what a careful SB3 user on a small machine sets; same for every variant
    venv = make_vec_env(w.env, n_envs=w.n_envs, seed=seed, vec_env_cls=SubprocVecEnv if subproc else DummyVecEnv)
    return PPO("MlpPolicy", venv, n_steps=w.n_steps, batch_size=256, n_epochs=4, seed=seed, device="cpu",
               verbose=0, policy_kwargs=w.policy_kwargs)


def _env_fn(w: E2EWorkload):
    """The env as the model's VecEnv holds it (Monitor included), for auturi.wrap(env_fn=)."""
    if isinstance(w.env, str):
        return None  # wrap rebuilds gymnasium ids itself
    from stable_baselines3.common.monitor import Monitor

    make = w.env
    return lambda: Monitor(make())


# ---------------------------------------------------------------------------- one run (child process)
def one_run(workload: str, variant: str, seed: int, timesteps: int, config_json: str | None) -> dict:
    from stable_baselines3.common.callbacks import BaseCallback

    import auturi

    class Episodes(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns: list[float] = []

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            return True

    w = WORKLOADS[workload]
    load = _loadavg()
    model = _model(w, seed, subproc=variant.endswith("subproc"))
    # Timed: wrap (it starts a fixed config's processes) and learn, what a user's script waits for.
    t0 = time.perf_counter()
    if variant in ("fresh", "warm", "fresh_subproc"):
        model = auturi.wrap(model, env_fn=_env_fn(w))
    elif variant == "fixed":
        model = auturi.wrap(model, config=auturi.Config.from_json(config_json), env_fn=_env_fn(w))
    wrap_seconds = time.perf_counter() - t0
    cb = Episodes()
    model.learn(timesteps, callback=cb)
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"workload": workload, "variant": variant, "seed": seed, "timesteps": timesteps,
                           "seconds": seconds, "wrap_seconds": wrap_seconds, "episodes": len(cb.returns),
                           "final_return": statistics.fmean(cb.returns[-20:]) if cb.returns else None,
                           "loadavg_before": load}
    if variant not in ("sb3", "subproc"):
        h = model.auturi
        out["layout"] = str(h.executor.config)
        tuner = getattr(h, "tuner", None)
        if tuner is not None:
            st = tuner.status()
            out["tuner"] = {k: st.get(k) for k in ("phase", "trials", "collects", "search_cost_seconds",
                                                   "locked_config", "cache_hit", "first_run", "profile_source",
                                                   "last_reconfigure")}
            out["tuner"]["reconfigures"] = list(getattr(tuner, "reconfigures", []) or [])
            out["tuner"]["declined"] = list(getattr(tuner, "declined", []) or [])
            out["tuner"]["history"] = [{"config": str(t.config), "source": t.source, "estimate": t.estimate,
                                        "status": t.status} for t in tuner.history]
            try:
                rec = tuner.result().to_record()
                out["tuner"]["record_keys"] = sorted(rec)
                for k in ("first_run", "off_choice", "startup_seconds"):
                    if k in rec:
                        out["tuner"][k] = rec[k]
            except Exception as exc:  # no trial finished: say so in the record
                out["tuner"]["result"] = str(exc)
        h.close()
    model.env.close()
    return out


def _loadavg() -> float | None:
    """The 1-minute load average before a run: this machine's neighbours swamp ratios when it is high."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def offline_choice(workload: str, seed: int, budget_seconds: float) -> dict:
    """The offline tuner's choice for the workload, measured on the wrapped model's executor."""
    import auturi
    from auturi.tuner import Tuner

    w = WORKLOADS[workload]
    model = auturi.wrap(_model(w, seed), tune=False, env_fn=_env_fn(w))
    try:
        t0 = time.perf_counter()
        res = Tuner("model", budget_seconds=budget_seconds, cache=None).tune(model.auturi.executor, w.n_steps)
        return {"config": res.choice.to_json(), "seconds": time.perf_counter() - t0, "trials": len(res.trials),
                "speedup_vs_serial": res.speedup("serial")}
    finally:
        model.auturi.close()


def _child(args: list[str], cache_dir: str | None, timeout: float) -> dict:
    env = dict(os.environ)
    if cache_dir is not None:
        env["AUTURI_CACHE_DIR"] = cache_dir
    p = subprocess.run([sys.executable, "-m", "bench.online_e2e", "--child", *args], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"child {args} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- driver
VARIANTS = ("sb3", "fresh", "warm", "fixed", "subproc", "fresh_subproc")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--lengths", type=float, nargs="+", default=[30.0, 120.0],
                    help="run lengths in seconds of plain SB3")
    ap.add_argument("--tune-budget", type=float, default=20.0, help="offline tuner budget for the fixed choice")
    ap.add_argument("--quick", action="store_true", help="1 seed, one 15 s length, no warm runs")
    ap.add_argument("--variants", default=None,
                    help="comma-separated subset of sb3,fresh,warm,fixed,subproc,fresh_subproc (default: the "
                         "first four; --quick: no warm)")
    ap.add_argument("--out", default="bench/results/online_e2e.json")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        kind, *rest = args.child
        if kind == "tune":
            print(json.dumps(offline_choice(rest[0], int(rest[1]), float(rest[2]))))
        else:
            wl, variant, seed, steps, cfg = rest
            print(json.dumps(one_run(wl, variant, int(seed), int(steps), None if cfg == "-" else cfg)))
        return {}
    if args.quick:
        args.seeds, args.lengths = 1, [15.0]
    names = [n for n in args.workloads.split(",") if n]
    variants = ["sb3", "fresh"] + ([] if args.quick else ["warm"]) + ["fixed"]
    if args.variants:
        asked = [v for v in args.variants.split(",") if v]
        bad = sorted(set(asked) - set(VARIANTS))
        if bad or ("warm" in asked and "fresh" not in asked) or "sb3" not in asked:
            ap.error(f"--variants: unknown {bad}" if bad else "--variants: warm needs fresh (its cache), and sb3 is "
                     "the reference")
        variants = [v for v in VARIANTS if v in asked]
    import stable_baselines3  # noqa: F401  (for the versions in the header)
    import torch  # noqa: F401

    out: dict[str, Any] = {"machine": machine_header(), "command": "python -m bench.online_e2e " +
                           " ".join(argv if argv is not None else sys.argv[1:]), "runs": [], "choices": {},
                           "rates": {}, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(out["machine"], flush=True)
    for name in names:
        w = WORKLOADS[name]
        probe = _child(["run", name, "sb3", "0", str(4 * w.n_envs * w.n_steps), "-"], None, 600)
        rate = probe["timesteps"] / probe["seconds"]
        out["rates"][name] = rate
        choice = _child(["tune", name, "0", str(args.tune_budget)], tempfile.mkdtemp(prefix="auturi-e2e-"), 900)
        out["choices"][name] = choice
        print(f"{name}: SB3 {rate:,.0f} steps/s; offline choice {choice['config']} "
              f"({choice['speedup_vs_serial']:.2f}x serial, {choice['seconds']:.0f} s)", flush=True)
        for length in args.lengths:
            steps = max(w.n_envs * w.n_steps, int(rate * length) // (w.n_envs * w.n_steps) * (w.n_envs * w.n_steps))
            for seed in range(args.seeds):
                cache = tempfile.mkdtemp(prefix="auturi-e2e-")
                for variant in variant_order(variants, seed):  # alternated, rotated: see variant_order
                    r = _child(["run", name, variant, str(seed), str(steps), choice["config"]],
                               cache if variant in ("fresh", "warm") else tempfile.mkdtemp(prefix="auturi-e2e-"),
                               max(600.0, 20 * length))
                    r["length"] = length
                    out["runs"].append(r)
                    tun = r.get("tuner") or {}
                    print(f"  {length:4.0f}s seed {seed} {variant:6s} {r['seconds']:7.1f}s  episodes {r['episodes']:5d}"
                          f"  return {r['final_return'] if r['final_return'] is not None else float('nan'):8.1f}  "
                          f"{r.get('layout', 'DummyVecEnv')}  {tun.get('phase', '')} {tun.get('trials', '')}",
                          flush=True)
    out["summary"] = summarize(out["runs"])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(table(out))
    return out


def variant_order(variants: list[str], seed: int) -> list[str]:
    """The order of one seed's runs: ``variants`` rotated by ``seed``, ``fresh`` and ``warm``
    one unit (warm reads the cache fresh leaves). In one fixed order, ``fresh`` (always second)
    read 4-6% slower than ``warm`` on CartPole in both seeds while both ran the same layout
    the whole run: a position effect a fixed order charges to one variant."""
    units: list[list[str]] = []
    for v in variants:
        if v == "warm" and units and units[-1] == ["fresh"]:
            units[-1].append(v)
        else:
            units.append([v])
    return [v for unit in rotated(units, seed) for v in unit]


def paired_ratio(by: dict[str, list[dict]], variant: str, against: str = "sb3") -> dict[str, float] | None:
    """``variant`` against ``against`` (plain SB3) seed by seed (``against``'s seconds / the
    variant's, the same seed's runs measured next to each other): their geometric mean, lowest
    and highest."""
    p = paired_ratios({x["seed"]: x["seconds"] for x in by.get(against, [])},
                      {x["seed"]: x["seconds"] for x in by.get(variant, [])})
    return None if p is None else {"geomean": p["geomean"], "min": p["min"], "max": p["max"], "seeds": p["n"]}


def summarize(runs: list[dict]) -> dict:
    """Per workload and length: median seconds per variant, its ratio to plain SB3, and the
    seed-paired ratio (:func:`paired_ratio`)."""
    summary: dict[str, Any] = {}
    for r in runs:
        key = f"{r['workload']}@{r['length']:.0f}s"
        summary.setdefault(key, {}).setdefault(r["variant"], []).append(r)
    result: dict[str, Any] = {}
    for key, by in summary.items():
        base = statistics.median(x["seconds"] for x in by["sb3"])
        row = {}
        for variant, xs in by.items():
            med = statistics.median(x["seconds"] for x in xs)
            rets = [x["final_return"] for x in xs if x["final_return"] is not None]
            row[variant] = {"median_seconds": med, "speedup_vs_sb3": base / med,
                            "episodes": statistics.fmean(x["episodes"] for x in xs),
                            "final_return": statistics.fmean(rets) if rets else None,
                            "paired_vs_sb3": paired_ratio(by, variant)}
        if "warm" in row and "fixed" in row:
            row["warm"]["paired_vs_fixed"] = paired_ratio(by, "warm", against="fixed")
        if "fresh_subproc" in row and "subproc" in row:
            row["fresh_subproc"]["paired_vs_subproc"] = paired_ratio(by, "fresh_subproc", against="subproc")
        if "fixed" in row and "fresh" in row:
            gain = row["fixed"]["speedup_vs_sb3"] - 1.0
            row["captured_gain"] = (row["fresh"]["speedup_vs_sb3"] - 1.0) / gain if gain > 0.05 else None
        result[key] = row
    return result


def table(out: dict) -> str:
    variants = ["sb3", "fresh", "warm", "fixed"]
    lines = ["| workload | " + " | ".join(f"{v} s" for v in variants) + " | fresh/sb3 | warm/sb3 | fixed/sb3 | "
             "warm/fixed | gain captured | episodes sb3/fresh |",
             "|---|" + "---:|" * (len(variants) + 6)]
    for key, row in out["summary"].items():
        def s(v: str) -> str:
            return f"{row[v]['median_seconds']:.1f}" if v in row else "-"

        def x(v: str) -> str:  # seed-paired geometric mean (lowest-highest seed) where seeds pair up
            if v not in row:
                return "-"
            p = row[v].get("paired_vs_sb3")
            if not p:
                return f"{row[v]['speedup_vs_sb3']:.2f}x"
            return f"{p['geomean']:.2f}x ({p['min']:.2f}-{p['max']:.2f})"

        pw = row.get("warm", {}).get("paired_vs_fixed")  # seed-paired, as the columns before it
        wf = f"{pw['geomean']:.2f}x ({pw['min']:.2f}-{pw['max']:.2f})" if pw else "-"
        cap = f"{row['captured_gain']:.0%}" if row.get("captured_gain") is not None else "-"
        eps = f"{row['sb3']['episodes']:.0f}/{row['fresh']['episodes']:.0f}" if "fresh" in row else "-"
        lines.append(f"| {key} | " + " | ".join(s(v) for v in variants) +
                     f" | {x('fresh')} | {x('warm')} | {x('fixed')} | {wf} | {cap} | {eps} |")
    for key, row in out["summary"].items():  # the SubprocVecEnv user's line, where asked for
        p = row.get("fresh_subproc", {}).get("paired_vs_subproc")
        if p:
            lines.append(f"\n{key}: SubprocVecEnv {row['subproc']['median_seconds']:.1f} s, its wrap "
                         f"{row['fresh_subproc']['median_seconds']:.1f} s: {p['geomean']:.2f}x "
                         f"({p['min']:.2f}-{p['max']:.2f})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
