"""Learning parity of the default path (issue 12, part 3): PPO trained by plain SB3 against
the same model under ``auturi.wrap(model)`` with online tuning on (a fresh tuner cache per
run), same seed, runs alternated, on tasks whose episodes are long (CartPole-v1 reaches its
500-step limit, Acrobot-v1 starts at its 500-step limit).

Per run it records what learning gives, none of it a timing:

- ``final_return``: mean return of the last ``--last`` episodes the Monitor logged;
- ``eval_return``: the final policy (stochastic, as it trains) on fresh envs, one episode
  each: separates a worse policy from a biased episode log;
- ``episodes``: episodes logged over the run; ``cut``: episodes that started without the
  previous one ending (a reconfigure recreated the env mid-episode; plain SB3 has none);
- ``reconfigures`` and the tuner's final phase and layout (the wrapped run).

``--control`` adds a third run per seed, ``sb3_cut``: plain SB3 whose envs all restart
(``VecEnv.reset``, fresh seeds) before the very rollouts where the paired wrapped run had
its episodes cut. It tells whether a gap comes from the cuts themselves (then ``sb3_cut``
shows it too) or from anything else the wrapped path does differently. ``--fixed`` adds
``auturi_fixed``: ``auturi.wrap(model, config=Config.serial(n_envs))``, the wrapped path
without tuning (no reconfigure, no cut).

Per task the table gives each side's mean and standard deviation over seeds and the paired
difference (auturi - sb3) with its standard error; ``|diff| > 2 SE`` is marked as beyond
seed noise. Wall seconds are printed but mean little on a shared machine.

Run: python -m bench.parity [--quick] [--control] [--fixed] [--tasks CartPole-v1 Acrobot-v1] [--seeds 5]
Writes bench/results/parity[_quick].json and .md (``--out DIR`` elsewhere).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.common import machine_header

# PPO settings from rl-baselines3-zoo, shortened to fit a 2-core machine; the steps are
# where plain SB3 is well past a random policy (CartPole ~400+, Acrobot ~-100).
TASKS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"n_envs": 8, "normalize": False, "steps": 30_000, "quick_steps": 12_000,
                    "ppo": {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                            "learning_rate": 1e-3, "ent_coef": 0.0}},
    "Acrobot-v1": {"n_envs": 8, "normalize": True, "steps": 50_000, "quick_steps": 20_000,
                   "ppo": {"n_steps": 256, "gae_lambda": 0.94, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0}},
}
KINDS = ("auturi", "sb3")  # the wrapped run first: sb3_cut replays its cuts
METRICS = ("final_return", "eval_return", "episodes", "cut")


def _episode_log_class() -> type:
    from stable_baselines3.common.callbacks import BaseCallback

    class EpisodeLog(BaseCallback):
        """Every episode the Monitor logs (its return), the cut episodes and the rollouts
        they were cut before, and the layout of every rollout of a wrapped model. With
        ``restart_before``, restarts every env before those rollouts (plain SB3 with the
        cuts of a wrapped run)."""

        def __init__(self, restart_before: tuple[int, ...] = (), seed: int = 0) -> None:
            super().__init__()
            self.returns: list[float] = []
            self.cut = 0
            self.cut_rollouts: list[int] = []
            self.layouts: list[str] = []
            self.restart_before, self.seed = set(restart_before), seed
            self._dones: Any = None  # the last step's dones of the previous rollout

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            return True

        def _on_rollout_end(self) -> None:
            starts = self.model.rollout_buffer.episode_starts[0].astype(bool)
            if self._dones is not None:
                cut = int((starts & ~self._dones.astype(bool)).sum())
                self.cut += cut
                if cut:
                    self.cut_rollouts.append(len(self.layouts))
            self._dones = self.locals["dones"].copy()
            h = vars(self.model).get("auturi")
            self.layouts.append(str(h.config) if h is not None else "")
            if len(self.layouts) in self.restart_before:
                self._restart()

        def _restart(self) -> None:
            from stable_baselines3.common.vec_env import VecNormalize

            env = self.model.env
            base = env.venv if isinstance(env, VecNormalize) else env
            base.seed(10**6 * (1 + self.seed) + 1000 * len(self.layouts))  # fresh seeds, as a recreated env gets
            self.model._last_obs = env.reset()
            self.model._last_episode_starts = np.ones(env.num_envs, dtype=bool)
            if isinstance(env, VecNormalize):
                self.model._last_original_obs = env.get_original_obs()

    import numpy as np

    return EpisodeLog


def _make_model(task: str, seed: int) -> Any:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    t = TASKS[task]
    env = make_vec_env(task, n_envs=t["n_envs"], seed=seed)
    if t["normalize"]:
        env = VecNormalize(env)
    return PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **t["ppo"])


def evaluate(model: Any, task: str, seed: int, episodes: int = 8) -> float:
    """Mean return of ``episodes`` episodes of the model's stochastic policy on fresh envs
    (seeds apart from training's), with the training's observation statistics."""
    import copy

    import numpy as np
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    env = make_vec_env(task, n_envs=episodes, seed=10_000 + 100 * seed)
    train_norm = model.get_vec_normalize_env()
    if train_norm is not None:
        env = VecNormalize(env, training=False, norm_reward=False)
        env.obs_rms = copy.deepcopy(train_norm.obs_rms)
    try:
        rets, _ = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=False,
                                  return_episode_rewards=True)
    finally:
        env.close()
    return float(np.mean(rets))


def run(task: str, seed: int, kind: str, steps: int, last: int, restart_before: tuple[int, ...] = ()) -> dict[str, Any]:
    """One ``learn`` of ``steps`` steps: ``kind`` ``sb3`` (plain), ``sb3_cut`` (plain, every
    env restarted before the rollouts ``restart_before``) or ``auturi``
    (``auturi.wrap(model)``, online tuning, a fresh cache directory) or ``auturi_fixed``
    (``auturi.wrap(model, config=Config.serial(n_envs))``)."""
    import numpy as np
    import torch

    import auturi

    torch.set_num_threads(1)
    model = _make_model(task, seed)
    log = _episode_log_class()(restart_before if kind == "sb3_cut" else (), seed)
    out: dict[str, Any] = {"task": task, "seed": seed, "kind": kind}
    with tempfile.TemporaryDirectory(prefix="auturi-parity-cache-") as cache:
        wrapped = kind.startswith("auturi")
        if kind == "auturi":
            model = auturi.wrap(model, budget={"cache": cache})
        elif kind == "auturi_fixed":
            model = auturi.wrap(model, config=auturi.Config.serial(model.n_envs))
        try:
            t0 = time.perf_counter()
            model.learn(steps, callback=log)
            out["seconds"] = time.perf_counter() - t0
            if kind == "auturi":
                tuner = model.auturi.tuner
                out["final_layout"] = str(model.auturi.config)
                out["tuner_phase"] = tuner.phase if tuner is not None else None
                out["trials"] = len(tuner.history) if tuner is not None else 0
        finally:
            if wrapped:
                model.auturi.close()
    out["timesteps"] = int(model.num_timesteps)
    out["episodes"] = len(log.returns)
    out["cut"] = log.cut
    out["cut_rollouts"] = log.cut_rollouts
    out["reconfigures"] = sum(a != b for a, b in zip(log.layouts, log.layouts[1:]))
    out["final_return"] = float(np.mean(log.returns[-last:])) if log.returns else float("nan")
    out["eval_return"] = evaluate(model, task, seed)
    return out


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def paired(runs: list[dict[str, Any]], metric: str, kind: str, versus: str) -> dict[str, Any] | None:
    """``metric`` of ``kind`` against ``versus`` over the seeds both ran: each side's mean
    and SD, the mean paired difference (kind - versus) with its standard error, and
    ``beyond_noise`` when |diff| > 2 SE.

    >>> rs = [{"seed": s, "kind": k, "r": v} for s, (a, b) in enumerate([(1.0, 1.0), (2.0, 2.5)])
    ...       for k, v in (("sb3", a), ("auturi", b))]
    >>> p = paired(rs, "r", "auturi", "sb3")
    >>> p["diff"], p["se"], p["beyond_noise"]
    (0.25, 0.25, False)
    """
    by = {(r["seed"], r["kind"]): r for r in runs}
    seeds = sorted({s for s, k in by if k == kind and (s, versus) in by})
    if not seeds:
        return None
    a = [float(by[s, versus][metric]) for s in seeds]
    b = [float(by[s, kind][metric]) for s in seeds]
    dm, dsd = _mean_sd([y - x for x, y in zip(a, b)])
    se = dsd / math.sqrt(len(seeds)) if len(seeds) > 1 else float("nan")
    return {"seeds": seeds, versus: _mean_sd(a), kind: _mean_sd(b), "diff": dm, "se": se,
            "beyond_noise": bool(se > 0 and abs(dm) > 2 * se) or bool(se == 0 and dm != 0)}


def summarize_task(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: auturi against sb3; with the control, against sb3_cut; with --fixed,
    auturi_fixed against sb3."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = paired(runs, metric, "auturi", "sb3")
        # (kind, versus, the side not in the main columns, where the difference goes)
        for kind, versus, extra, key in (("auturi", "sb3_cut", "sb3_cut", "vs_sb3_cut"),
                                         ("auturi_fixed", "sb3", "auturi_fixed", "fixed_vs_sb3")):
            p = paired(runs, metric, kind, versus)
            if p is not None:
                out[metric][extra] = p[extra]
                out[metric][key] = {k: p[k] for k in ("diff", "se", "beyond_noise")}
    return out


def _pm(x: tuple[float, float]) -> str:
    return f"{x[0]:.1f} ± {x[1]:.1f}"


def _diff(d: dict[str, Any]) -> str:
    return f"{d['diff']:+.1f} ± {d['se']:.1f}{' **beyond noise**' if d['beyond_noise'] else ''}"


def markdown(res: dict[str, Any]) -> str:
    control = any(r["kind"] == "sb3_cut" for r in res["runs"])
    fixed = any(r["kind"] == "auturi_fixed" for r in res["runs"])
    head = "| task | steps | metric | SB3 | auturi | auturi - SB3 ± SE |"
    rule = "|---|---:|---|---:|---:|---:|"
    if control:
        head += " SB3 with auturi's cuts | auturi - that ± SE |"
        rule += "---:|---:|"
    if fixed:
        head += " auturi fixed serial | fixed - SB3 ± SE |"
        rule += "---:|---:|"
    lines = ["# Learning parity: plain SB3 vs auturi.wrap(model) (online tuning)", "",
             f"`{res['command']}`  ", f"{res['machine']}; {res['seconds'] / 60:.1f} min", "",
             "Mean ± SD over seeds; differences paired by seed, ± their standard error.", "", head, rule]
    for task, s in res["summary"].items():
        for metric in METRICS:
            m = s[metric]
            row = f"| {task} | {res['steps'][task]} | {metric} | {_pm(m['sb3'])} | {_pm(m['auturi'])} | {_diff(m)} |"
            if control:
                row += f" {_pm(m['sb3_cut'])} | {_diff(m['vs_sb3_cut'])} |"
            if fixed:
                row += f" {_pm(m['auturi_fixed'])} | {_diff(m['fixed_vs_sb3'])} |"
            lines.append(row)
    lines += ["", "Per run:", "", "| task | seed | kind | final_return | eval_return | episodes | cut | reconfigures | "
              "tuner | seconds |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in res["runs"]:
        tuner = f"{r.get('tuner_phase')}, {r.get('trials')} trials" if r["kind"] == "auturi" else ""
        lines.append(f"| {r['task']} | {r['seed']} | {r['kind']} | {r['final_return']:.1f} | {r['eval_return']:.1f} | "
                     f"{r['episodes']} | {r['cut']} | {r['reconfigures']} | {tuner} | {r['seconds']:.1f} |")
    lines += ["", f"final_return: mean of the last {res['last']} logged episodes; eval_return: the final stochastic "
              f"policy, 8 fresh episodes; cut: episodes restarted without ending (a reconfigure recreated the env); "
              f"beyond noise: |diff| > 2 SE.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 seeds, short runs (< 3 min)")
    ap.add_argument("--control", action="store_true", help="also plain SB3 with the wrapped run's cuts (sb3_cut)")
    ap.add_argument("--fixed", action="store_true", help="also auturi.wrap(model, config=serial) (auturi_fixed)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5, --quick 2)")
    ap.add_argument("--steps", type=int, default=None, help="learn steps for every task (default: per task)")
    ap.add_argument("--last", type=int, default=20, help="final_return averages this many last episodes")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    import stable_baselines3  # noqa: F401  (listed in the machine header)
    import torch  # noqa: F401

    seeds = args.seeds or (2 if args.quick else 5)
    steps = {t: args.steps or TASKS[t]["quick_steps" if args.quick else "steps"] for t in args.tasks}
    res: dict[str, Any] = {"machine": machine_header(), "last": args.last, "steps": steps,
                           "command": "python -m bench.parity " + " ".join(sys.argv[1:] if argv is None else argv),
                           "runs": []}
    print(res["machine"], flush=True)
    t0 = time.perf_counter()
    kinds = KINDS + (("sb3_cut",) if args.control else ()) + (("auturi_fixed",) if args.fixed else ())
    for task in args.tasks:
        for seed in range(seeds):
            cuts: tuple[int, ...] = ()
            for kind in kinds:  # alternated: a drift of the machine hits every kind alike
                r = run(task, seed, kind, steps[task], args.last, restart_before=cuts)
                cuts = tuple(r["cut_rollouts"]) if kind == "auturi" else cuts
                res["runs"].append(r)
                print(f"{task} seed {seed} {kind:7s}: final {r['final_return']:7.1f}  eval {r['eval_return']:7.1f}  "
                      f"episodes {r['episodes']:4d}  cut {r['cut']:3d}  reconfigures {r['reconfigures']:2d}  "
                      f"{r['seconds']:5.1f}s {r.get('final_layout', '')} {r.get('tuner_phase') or ''}", flush=True)
    res["seconds"] = time.perf_counter() - t0
    res["summary"] = {t: summarize_task([r for r in res["runs"] if r["task"] == t]) for t in args.tasks}
    name = "parity_quick" if args.quick else "parity"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(md)
    print(md)
    return res


if __name__ == "__main__":
    main()
