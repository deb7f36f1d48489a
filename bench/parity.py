"""Learning parity of the default path (issue 12, part 3): PPO trained by plain SB3 against
the same model under ``auturi.wrap(model)`` with online tuning on (a fresh tuner cache per
run), same seed, runs alternated, on tasks whose episodes are long (CartPole-v1 reaches its
500-step limit, Acrobot-v1 starts at its 500-step limit).

One module of ~440 lines: its parts (the runs, the controls, the noise of :class:`ExecutorNoise`
that ``tests/test_sb3_default_parity.py`` also uses, the tables) serve this one benchmark.

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
without tuning (no reconfigure, no cut). ``--noise`` adds ``sb3_noise``: plain SB3's own loop
acting with the action noise an Auturi executor draws (:class:`ExecutorNoise`); where it
equals ``auturi`` episode for episode, a gap between ``auturi`` and ``sb3`` is the random
stream of the actions, nothing else.

Per task the table gives each side's mean and standard deviation over seeds and the paired
difference (auturi - sb3) with its standard error; a difference is marked beyond seed noise
when a two-sided paired t-test at 5% says so (``|diff| > t(0.975, seeds - 1) SE``: 2.78 SE
for 5 seeds; a flat ``2 SE`` rule, used before, is a 12% test at 5 seeds). Wall seconds are printed but mean little on a shared machine.

Run: python -m bench.parity [--quick] [--control] [--fixed] [--noise] [--tasks CartPole-v1 Acrobot-v1]
[--seeds 5] [--first-seed 0] [--name NAME]; ``--merge A.json B.json ...`` re-summarizes the runs
of earlier results (e.g. seed ranges run apart) into one table.
Writes bench/results/parity[_quick].json and .md (``--name`` and ``--out DIR`` elsewhere).
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
# The optional kinds, each compared with one main kind: (kind, versus, its column's title).
EXTRA = (("sb3_cut", "auturi", "SB3 with auturi's cuts"), ("auturi_fixed", "sb3", "auturi fixed serial"),
         ("sb3_noise", "auturi", "SB3 with auturi's noise"))
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


class ExecutorNoise:
    """Plain SB3 acting with the action noise an Auturi executor draws (``kind`` ``sb3_noise``):
    env ``i``'s uniform numbers for its steps come from its noise stream
    (:mod:`auturi.executor.noise`, as ``Executor._prepare`` draws them) and become an action by the inverse
    CDF of ``auturi.sampling``, where plain SB3 samples from torch's global stream. Everything
    else is SB3's own loop. It separates the two things a wrapped run changes: if it learns
    exactly as ``auturi.wrap(model)`` does, the wrapped path's data is SB3's and any gap to
    plain SB3 is which random numbers the actions used.

    Installed on ``model.policy`` for the ``with`` block (an evaluation after it samples from
    torch again); Discrete and Box actions. Each ``sample()`` of the policy's distribution is
    one step of every env: SB3's ``collect_rollouts`` samples once per step, through
    ``forward``."""

    def __init__(self, model: Any, seed: int) -> None:
        self.policy, self.seed = model.policy, int(seed)
        self.n_envs, self.n_steps = int(model.n_envs), int(model.n_steps)
        self.steps = 0  # steps each env has taken: keys the streams, as the executor's _steps_done
        self._noise: Any = None

    def __enter__(self) -> "ExecutorNoise":
        self._dist_from_latent = self.policy._get_action_dist_from_latent
        self.policy._get_action_dist_from_latent = self._patched
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.policy._get_action_dist_from_latent  # the class's method again

    def _patched(self, latent_pi: Any) -> Any:
        dist = self._dist_from_latent(latent_pi)
        dist.sample = lambda: self._sample(dist)
        return dist

    def _uniforms(self) -> Any:
        import numpy as np
        import torch

        from auturi.executor.noise import NoiseStreams

        t = self.steps % self.n_steps
        if t == 0:  # a rollout starts: every env's stream for its n_steps, as _prepare draws them
            k = int(np.prod(self.policy.action_space.shape)) or 1
            self._noise = np.zeros((self.n_steps, self.n_envs, k), np.float32)
            NoiseStreams().fill(self._noise, self.seed, 0, self.steps)
        self.steps += 1
        return torch.as_tensor(self._noise[t])

    def _sample(self, dist: Any) -> Any:
        from gymnasium import spaces

        from auturi.sampling import categorical_from_uniform, normal_from_uniform

        u = self._uniforms()
        if isinstance(self.policy.action_space, spaces.Discrete):
            return categorical_from_uniform(dist.distribution.probs, u[:, 0])
        if isinstance(self.policy.action_space, spaces.Box):
            return normal_from_uniform(dist.distribution.mean, dist.distribution.stddev, u)
        raise NotImplementedError(f"ExecutorNoise: {self.policy.action_space} (Discrete and Box only)")


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
    env restarted before the rollouts ``restart_before``), ``sb3_noise`` (plain, acting with
    the executor's noise: :class:`ExecutorNoise`) or ``auturi``
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
            model = auturi.wrap(model, tuner_options={"cache": cache})
        elif kind == "auturi_fixed":
            model = auturi.wrap(model, config=auturi.Config.serial(model.n_envs))
        try:
            t0 = time.perf_counter()
            if kind == "sb3_noise":
                with ExecutorNoise(model, seed):
                    model.learn(steps, callback=log)
            else:
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


# Two-sided 95% quantiles of Student's t, by degrees of freedom (scipy.stats.t.ppf(0.975, df)).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The paired t-test's critical ratio |diff| / SE at 5% (two-sided) for ``df`` degrees of
    freedom; 2.0 past the table (df > 30, where it is 2.04 -> 1.96).

    >>> t975(4), t975(19), t975(100)
    (2.776, 2.093, 2.0)
    """
    return _T975[df - 1] if 1 <= df <= len(_T975) else 2.0


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def paired(runs: list[dict[str, Any]], metric: str, kind: str, versus: str) -> dict[str, Any] | None:
    """``metric`` of ``kind`` against ``versus`` over the seeds both ran: each side's mean
    and SD, the mean paired difference (kind - versus) with its standard error, and
    ``beyond_noise`` when |diff| > :func:`t975` (seeds - 1) SE.

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
            "beyond_noise": bool(se > 0 and abs(dm) > t975(len(seeds) - 1) * se) or bool(se == 0 and dm != 0)}


def summarize_task(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: auturi against sb3, and each optional kind that ran against the main
    kind of :data:`EXTRA` (``sb3_cut`` and ``sb3_noise`` against auturi, ``auturi_fixed``
    against sb3): its mean and SD under its name, the paired difference under ``<kind>_diff``."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = paired(runs, metric, "auturi", "sb3")
        for kind, versus, _ in EXTRA:
            # "fixed - SB3", else "auturi - that"
            p = paired(runs, metric, kind, versus) if kind == "auturi_fixed" else paired(runs, metric, versus, kind)
            if p is not None:
                out[metric][kind] = p[kind]
                out[metric][kind + "_diff"] = {k: p[k] for k in ("diff", "se", "beyond_noise")}
    return out


def _pm(x: tuple[float, float]) -> str:
    return f"{x[0]:.1f} ± {x[1]:.1f}"


def _diff(d: dict[str, Any]) -> str:
    return f"{d['diff']:+.1f} ± {d['se']:.1f}{' **beyond noise**' if d['beyond_noise'] else ''}"


def markdown(res: dict[str, Any]) -> str:
    extra = [(k, v, title) for k, v, title in EXTRA if any(r["kind"] == k for r in res["runs"])]
    head = "| task | steps | metric | SB3 | auturi | auturi - SB3 ± SE |"
    rule = "|---|---:|---|---:|---:|---:|"
    for kind, versus, title in extra:
        head += f" {title} | {'fixed - SB3' if kind == 'auturi_fixed' else 'auturi - that'} ± SE |"
        rule += "---:|---:|"
    lines = ["# Learning parity: plain SB3 vs auturi.wrap(model) (online tuning)", "",
             f"`{res['command']}`  ", f"{res['machine']}; {res['seconds'] / 60:.1f} min", "",
             "Mean ± SD over seeds; differences paired by seed, ± their standard error.", "", head, rule]
    for task, s in res["summary"].items():
        for metric in METRICS:
            m = s[metric]
            row = f"| {task} | {res['steps'][task]} | {metric} | {_pm(m['sb3'])} | {_pm(m['auturi'])} | {_diff(m)} |"
            for kind, _, _ in extra:
                row += f" {_pm(m[kind])} | {_diff(m[kind + '_diff'])} |" if kind in m else " | |"
            lines.append(row)
    lines += ["", "Per run:", "", "| task | seed | kind | final_return | eval_return | episodes | cut | reconfigures | "
              "tuner | seconds |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in res["runs"]:
        tuner = f"{r.get('tuner_phase')}, {r.get('trials')} trials" if r["kind"] == "auturi" else ""
        lines.append(f"| {r['task']} | {r['seed']} | {r['kind']} | {r['final_return']:.1f} | {r['eval_return']:.1f} | "
                     f"{r['episodes']} | {r['cut']} | {r['reconfigures']} | {tuner} | {r['seconds']:.1f} |")
    lines += ["", f"final_return: mean of the last {res['last']} logged episodes; eval_return: the final stochastic "
              f"policy, 8 fresh episodes; cut: episodes restarted without ending (a reconfigure recreated the env); "
              f"beyond noise: |diff| > t(0.975, seeds - 1) SE (a paired t-test at 5%).", ""]
    return "\n".join(lines)


def _run_all(args: argparse.Namespace, res: dict[str, Any]) -> None:
    seeds = args.seeds or (2 if args.quick else 5)
    kinds = KINDS + tuple(k for k, flag in (("sb3_cut", args.control), ("auturi_fixed", args.fixed),
                                            ("sb3_noise", args.noise)) if flag)
    for task in args.tasks:
        for seed in range(args.first_seed, args.first_seed + seeds):
            cuts: tuple[int, ...] = ()
            for kind in kinds:  # alternated: a drift of the machine hits every kind alike
                r = run(task, seed, kind, res["steps"][task], args.last, restart_before=cuts)
                cuts = tuple(r["cut_rollouts"]) if kind == "auturi" else cuts
                res["runs"].append(r)
                print(f"{task} seed {seed} {kind:9s}: final {r['final_return']:7.1f}  eval {r['eval_return']:7.1f}  "
                      f"episodes {r['episodes']:4d}  cut {r['cut']:3d}  reconfigures {r['reconfigures']:2d}  "
                      f"{r['seconds']:5.1f}s {r.get('final_layout', '')} {r.get('tuner_phase') or ''}", flush=True)


def _merged(paths: list[str], command: str) -> dict[str, Any]:
    """The runs of several results files as one result (the first file's machine line; a
    task's steps must agree, a (task, seed, kind) must not repeat)."""
    res: dict[str, Any] = {"command": command, "runs": [], "steps": {}, "seconds": 0.0}
    seen: set[tuple[str, int, str]] = set()
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        res.setdefault("machine", part["machine"])
        res.setdefault("last", part["last"])
        for task, n in part["steps"].items():
            if res["steps"].setdefault(task, n) != n:
                raise SystemExit(f"{path}: {task} ran {n} steps, an earlier file {res['steps'][task]}; merge runs "
                                 f"of the same length only")
        for r in part["runs"]:
            key = (r["task"], r["seed"], r["kind"])
            if key in seen:
                raise SystemExit(f"{path}: {key} is in an earlier file too; merge disjoint seed ranges")
            seen.add(key)
            res["runs"].append(r)
        res["seconds"] += part["seconds"]
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 seeds, short runs (< 3 min)")
    ap.add_argument("--control", action="store_true", help="also plain SB3 with the wrapped run's cuts (sb3_cut)")
    ap.add_argument("--fixed", action="store_true", help="also auturi.wrap(model, config=serial) (auturi_fixed)")
    ap.add_argument("--noise", action="store_true", help="also plain SB3 acting with auturi's noise (sb3_noise)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", type=int, default=None, help="how many seeds (default 5, --quick 2)")
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed .. first-seed + seeds - 1")
    ap.add_argument("--steps", type=int, default=None, help="learn steps for every task (default: per task)")
    ap.add_argument("--last", type=int, default=20, help="final_return averages this many last episodes")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="summarize these results files' runs together "
                    "instead of running (needs --name)")
    ap.add_argument("--name", default=None, help="output file stem (default parity, --quick parity_quick)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    command = "python -m bench.parity " + " ".join(sys.argv[1:] if argv is None else argv)
    name = args.name or ("parity_quick" if args.quick else "parity")
    if args.merge:
        if not args.name:
            ap.error("--merge needs --name: it must not overwrite the files it reads")
        res = _merged(args.merge, command)
    else:
        import stable_baselines3  # noqa: F401  (listed in the machine header)
        import torch  # noqa: F401

        steps = {t: args.steps or TASKS[t]["quick_steps" if args.quick else "steps"] for t in args.tasks}
        res = {"machine": machine_header(), "last": args.last, "steps": steps, "command": command, "runs": []}
        print(res["machine"], flush=True)
        t0 = time.perf_counter()
        _run_all(args, res)
        res["seconds"] = time.perf_counter() - t0
    tasks = list(dict.fromkeys(r["task"] for r in res["runs"]))
    res["summary"] = {t: summarize_task([r for r in res["runs"] if r["task"] == t]) for t in tasks}
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
