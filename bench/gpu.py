"""The GPU machine's runs in one script (issues 32 and 33, section 4): the runs of
``../shared/data/gpu-2026-11-26/README.md`` repeated on a GPU box, with only torch, gymnasium,
SB3 and ale-py installed (plus auturi from ``src/``), within 6 minutes.

Part 1, SB3 PPO end to end: ``make_atari_env("PongNoFrameskip-v4", n_envs=32, seed=0)`` +
``VecFrameStack(4)``, CnnPolicy on cuda, n_steps 128, batch 256, 4 epochs; seconds of ``learn``
(building the model and ``auturi.wrap`` timed apart) for plain SB3 SubprocVecEnv,
``auturi.wrap(model)`` on the DummyVecEnv model (online tuning, an empty cache: a fresh
``AUTURI_CACHE_DIR`` per run), ``auturi.wrap(model)`` on the SubprocVecEnv model and
``auturi.wrap(model, config=<a fixed layout>)``; ratios against plain SB3 SubprocVecEnv of the
same run. For each default wrap, the online tuner's moves: which layout each rollout ran, what
each move cost, when it locked in.

Part 2, collection only: Pong (``ALE/Pong-v5`` frameskip 1 + AtariPreprocessing +
FrameStackObservation(4)), 64 envs x 64 steps, ``NatureCNNActorCritic(4, 6)``: the envs-only
ceiling (the envs stepped with random actions in one process per core, nothing else), SB3's
SubprocVecEnv with the policy on cuda in the main process, ``auturi.tune(devices=["cpu",
"cuda"], budget_seconds=45)`` then collects with its choice (its predicted against measured
throughput beside), one overlapped layout and one of several actors (:data:`SPREAD`).

Part 3, C++ vector env: Pong in ale-py's ``AtariVectorEnv`` (ale-py >= 0.11; its standard
preprocessing in C++: 84x84 grey, frame skip 4, 4 stacked frames), 64 envs x 64 steps, the same
CNN on cuda: ``ale_envs_only`` (the vector env alone, random actions: its ceiling),
``ale_alone`` (the vector env alone in sync mode, ``batch_size`` 64, a C++ thread per core, the
policy acting on every batch in this process) and Auturi on ``ale:pong`` in lockstep layouts
(:data:`ALE_LAYOUTS`: each actor's envs stay in one vector env on its C++ threads), then
``auturi.tune("ale:pong")`` over lockstep layouts only (20 s) and its choice; ratios against
``ale_alone`` and ``ale_envs_only``. Skipped, with the reason, where ale-py has no
``AtariVectorEnv``.

Runs that would not end within ``--budget-seconds`` (estimated from the runs before them) are
skipped and named in the table; a run that fails is recorded with its error and the others go
on. The order: part 1 at its first step count, part 2, part 1's longer runs, then part 3 (the
SB3 recipe at both lengths is what the GPU targets are read from; a short budget cuts part 3
first). Records: ``DIR/part1_sb3_ppo.json``,
``DIR/part2_collect.json``, ``DIR/part3_ale_vector.json``, ``DIR/summary.md``.

One module over 400 lines: it is the one script a GPU box runs from the project's tree with
nothing but torch, gymnasium, SB3 and ale-py beside auturi, so the three parts, the time
budget, the records and the summary travel together.

Run (GPU box):  PYTHONPATH=src python -m bench.gpu --out DIR
On the device tool's machine (2026-11-27: Python 3.12, torch 2.11+cu130, no internet), carry
wheels of gymnasium, farama-notifications, stable-baselines3 and ale-py, and run the CUDA tests
and this in ONE call (an idle machine is given back after 30 s; a second call paid a new
start): ``pytest tests/ -k "cuda or gpu"`` (``tests/test_cuda_wait.py`` among them) capped at 90 s, then ``--budget-seconds 480``
under a 540 s timeout, so part 1's 98k-step runs and part 3 fit (at 330 s both were cut).
Check (no GPU): PYTHONPATH=src python -m bench.gpu --smoke --out /tmp/gpu_smoke   (tiny, on cpu)
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from bench.common import ChildRates, summarize

try:
    # At import, as a user's training script does: SB3's SubprocVecEnv workers (forkserver,
    # SB3's default) import this module as their main one, and find the ALE ids registered.
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
except ImportError:  # no ale-py: the smoke check runs CartPole
    ale_py = None

FIXED = "2,16,8,1,cuda,16"
"""The fixed offline layout of part 1 (the data README's ``Config(2, 16, 8, 1, "cuda", 16)``)."""
OVERLAP = "1,64,32,4,cuda,16"
"""Part 2's overlapped layout: 4 CUDA replicas of batch 16 over 64 envs in 32 env lanes, so the
actor's envs step while other batches are in inference (``ActorPlan.overlap``)."""
SPREAD = "4,16,4,1,cuda,16"
"""Part 2's many-actor layout: 4 actors x 16 envs in 4 lanes each, one CUDA replica in each
actor. On 2026-11-26 (H200 box) it measured 4,862 steps/s with its 16 lanes pinned to 7 of
the 16 cores (the layout's rule then: actor ``a``'s lanes on the cores after core ``a``); the
layout now spreads them over all 16 (``auturi.executor.layout.lane_cores``)."""
ALE_LAYOUTS = ("2,32,1,1,cuda,32", "4,16,1,1,cuda,16", "1,64,1,1,cuda,64")
"""Part 3's Auturi layouts on ``ale:pong``: lockstep (one CUDA replica in each actor, a batch of
all its envs, degree 1), so every step names all of an actor's envs and they stay in ONE
``AtariVectorEnv`` on its C++ threads; a step naming only some would move them to one-env
vector envs (``auturi.envs.ale_vector``), which is not the design being compared. 1 actor
runs in this process; 2 and 4 actors overlap one actor's inference with another's stepping.
The overlapping ones first: on the H200 box (2026-11-27) 1 actor measured 0.89x the vector env
alone and the budget cut the other two, the ones that can beat it."""
SYSTEMS_1 = ("sb3_subproc", "wrap_dummy", "wrap_subproc", "fixed")
LABELS_1 = {"sb3_subproc": "plain SB3, SubprocVecEnv",
            "wrap_dummy": "`auturi.wrap(model)`, DummyVecEnv model (online, empty cache)",
            "wrap_subproc": "`auturi.wrap(model)`, SubprocVecEnv model (online, empty cache)",
            "fixed": "`auturi.wrap(model, config=Config({}))`"}


def _config(text: str) -> Any:
    """``"2,16,8,1,cuda,16"`` as an :class:`auturi.Config` (its six fields in order)."""
    from auturi import Config

    a, e, d, p, dev, b = text.split(",")
    return Config(int(a), int(e), int(d), int(p), dev.strip(), int(b))


# -- the envs (module level: env workers and the ceiling's processes import them by name)
def make_pong() -> Any:
    """The data README's collection env: ALE/Pong-v5 (frameskip 1) + AtariPreprocessing +
    FrameStackObservation(4), 4x84x84 uint8."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    return gym.wrappers.FrameStackObservation(env, 4)


def make_cartpole() -> Any:
    import gymnasium as gym

    return gym.make("CartPole-v1")


def _has_ale() -> bool:
    return ale_py is not None


# -- settings: the GPU box's, or the smoke check's (tiny, on cpu)
def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What each part runs; ``--smoke`` shrinks every size and puts everything on cpu."""
    if not args.smoke:
        return {"device": "cuda", "atari": True, "n_envs": 32, "n_steps": 128, "batch_size": 256, "n_epochs": 4,
                "steps": args.steps or [32_768, 98_304], "fixed": args.fixed or FIXED,
                "collect_envs": 64, "collect_steps": 64, "collect_samples": 3, "ceiling_procs": args.ceiling_procs,
                "tune_seconds": 45.0, "tune_devices": ["cpu", "cuda"], "overlap": args.overlap or OVERLAP,
                "spread": args.spread or SPREAD,
                "env": "pong",
                "ale_game": "pong", "ale_envs": 64, "ale_steps": 64, "ale_samples": 3, "ale_device": "cuda",
                "ale_threads": min(_cores(), 64), "ale_layouts": args.ale_layouts or list(ALE_LAYOUTS),
                "ale_tune_seconds": 20.0 if args.ale_tune_seconds is None else args.ale_tune_seconds}
    ale = _has_ale()
    return {"device": "cpu", "atari": ale, "n_envs": 4, "n_steps": 16, "batch_size": 32, "n_epochs": 1,
            "steps": args.steps or [128, 256], "fixed": args.fixed or "2,2,2,1,cpu,2",
            "collect_envs": 4, "collect_steps": 8, "collect_samples": 2, "ceiling_procs": 2,
            "tune_seconds": 4.0, "tune_devices": ["cpu"], "overlap": args.overlap or "1,4,2,2,cpu,2",
            "spread": args.spread or "2,2,2,1,cpu,2",
            "env": "pong" if ale else "cartpole",
            "ale_game": "pong", "ale_envs": 4, "ale_steps": 8, "ale_samples": 2, "ale_device": "cpu",
            "ale_threads": min(_cores(), 4), "ale_layouts": args.ale_layouts or SMOKE_ALE_LAYOUTS,
            "ale_tune_seconds": SMOKE_ALE_TUNE if args.ale_tune_seconds is None else args.ale_tune_seconds}


def _cores() -> int:
    """The cores this process may run on (the C++ threads of part 3's vector envs: one each)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# -- part 1: SB3 PPO end to end
def build_model(s: dict[str, Any], subproc: bool) -> Any:
    """PPO on the data README's Atari recipe (CartPole's MlpPolicy in a smoke run without ale-py)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    cls = SubprocVecEnv if subproc else DummyVecEnv
    if s["atari"]:  # PongNoFrameskip-v4 (registered at import, above): SB3's AtariWrapper skips the frames
        env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=s["n_envs"], seed=0, vec_env_cls=cls), 4)
        policy = "CnnPolicy"
    else:
        env = make_vec_env("CartPole-v1", n_envs=s["n_envs"], seed=0, vec_env_cls=cls)
        policy = "MlpPolicy"
    return PPO(policy, env, n_steps=s["n_steps"], batch_size=s["batch_size"], n_epochs=s["n_epochs"], seed=0,
               device=s["device"], verbose=0)


def _watch_rollouts(handle: Any, rows: list[dict]) -> None:
    """Record, per rollout, the layout it ran, its seconds and the tuner's moves in it: the
    handle's ``collect_rollout`` is wrapped on this instance (a bench's look, the model's
    data untouched)."""
    inner, tuner = handle.collect_rollout, handle.tuner

    def collect_rollout(num_steps: int, remaining: Any = None, measure: bool = True) -> Any:
        cfg, moves, t0 = handle.config, len(tuner.reconfigures) if tuner else 0, time.perf_counter()
        out = inner(num_steps, remaining, measure)
        new = tuner.reconfigures[moves:] if tuner else []
        rows.append({"rollout": len(rows), "config": str(cfg), "seconds": time.perf_counter() - t0,
                     "moves": [{"to": str(_cfg_of(m["to"])), "seconds": m["seconds"]} for m in new],
                     "move_seconds": sum(m["seconds"] for m in new),
                     "phase": getattr(tuner, "phase", None), "remaining": remaining})
        return out

    handle.collect_rollout = collect_rollout


def _cfg_of(d: Any) -> Any:
    from auturi import Config

    try:
        return Config.from_dict(d)
    except Exception:  # an older record's shape: shown as it is
        return d


def run_learn(kind: str, steps: int, s: dict[str, Any]) -> dict[str, Any]:
    """One timed ``learn`` of ``kind`` (see :data:`SYSTEMS_1`), everything it started closed."""
    import auturi

    out: dict[str, Any] = {"system": kind, "steps": steps}
    cache_dir = tempfile.mkdtemp(prefix="auturi-gpu-cache-")
    old_cache = os.environ.get("AUTURI_CACHE_DIR")
    os.environ["AUTURI_CACHE_DIR"] = cache_dir  # an empty cache: the default one line as a first run sees it
    model = None
    try:
        t0 = time.perf_counter()
        model = build_model(s, subproc=kind in ("sb3_subproc", "wrap_subproc"))
        out["build_seconds"] = time.perf_counter() - t0
        rows: list[dict] = []
        if kind != "sb3_subproc":
            t0 = time.perf_counter()
            try:
                model = auturi.wrap(model, config=_config(s["fixed"])) if kind == "fixed" else auturi.wrap(model)
            except Exception as e:  # e.g. EnvRebuildError on a SubprocVecEnv model: the table says so
                out.update(refused=f"{type(e).__name__}: {e}")
                return out
            out["wrap_seconds"] = time.perf_counter() - t0
            _watch_rollouts(model.auturi, rows)
        t0 = time.perf_counter()
        model.learn(steps)
        out["learn_seconds"] = time.perf_counter() - t0
        if kind != "sb3_subproc":
            h = model.auturi
            out["layout"] = str(h.config)
            out["wrap_phases"] = dict(getattr(h, "wrap_seconds", {}) or {})
            out["rollouts"] = rows
            t = h.tuner
            if t is not None:
                out["tuner"] = {"phase": t.phase, "locked": str(t.locked_config) if t.locked_config else None,
                                "locked_at_collect": t.locked_at_collect, "first_run": t.first_run_cost(),
                                "reconfigures": list(t.reconfigures),
                                "trials": [{"config": str(tr.config), "source": tr.source, "status": tr.status,
                                            "estimate": tr.estimate, "predicted": tr.predicted}
                                           for tr in t.history]}
        else:
            out["layout"] = f"SubprocVecEnv x {s['n_envs']}"
    finally:
        if model is not None:
            h = getattr(model, "auturi", None)
            if h is not None:
                h.close()
            model.get_env().close()
        if old_cache is None:
            os.environ.pop("AUTURI_CACHE_DIR", None)
        else:
            os.environ["AUTURI_CACHE_DIR"] = old_cache
        shutil.rmtree(cache_dir, ignore_errors=True)
    return out


def part1(s: dict[str, Any], clock: "Clock", long_systems: list[str], first: int,
          prior: list[dict] | None = None) -> dict[str, Any]:
    """Every system at ``first`` steps, ``long_systems`` at the other step counts of
    ``s["steps"]``, each run skipped when its estimate (from ``prior`` runs and this call's)
    would overrun the budget; returns this call's runs, ratios over ``prior`` + these."""
    runs: list[dict] = []
    skipped: list[str] = []
    for steps in s["steps"]:
        kinds = SYSTEMS_1 if steps == first else [k for k in SYSTEMS_1 if k in long_systems]
        if steps != first:
            # The longer runs go as a group or not at all: plain SB3 alone at 98k is no ratio.
            est = sum(_estimate(k, steps, (prior or []) + runs) for k in kinds)
            if not clock.allows(est):
                skipped += [f"{k} at {steps:,} steps (with {', '.join(kinds)}: estimated {est:.0f} s, "
                            f"{clock.left():.0f} s left)" for k in kinds]
                print(f"part 1: skipped {', '.join(kinds)} at {steps:,} steps (estimated {est:.0f} s, "
                      f"{clock.left():.0f} s left)", flush=True)
                continue
        for kind in kinds:
            est = _estimate(kind, steps, (prior or []) + runs)
            if not clock.allows(est):
                skipped.append(f"{kind} at {steps:,} steps (estimated {est:.0f} s, {clock.left():.0f} s left)")
                print(f"part 1: skipped {skipped[-1]}", flush=True)
                continue
            print(f"part 1: {kind} at {steps:,} steps ...", flush=True)
            try:
                r = run_learn(kind, steps, s)
            except Exception as e:
                r = {"system": kind, "steps": steps, "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()}
            runs.append(r)
            print("   " + _brief(r), flush=True)
    _ratios((prior or []) + runs)
    return {"settings": {k: s[k] for k in ("device", "atari", "n_envs", "n_steps", "batch_size", "n_epochs",
                                           "steps", "fixed")}, "runs": runs, "skipped": skipped}


def _ratios(runs: list[dict]) -> None:
    """Each run's plain-SB3-SubprocVecEnv ``learn`` seconds over its own, same steps, same
    script run (and with the wrap's seconds counted in)."""
    for r in runs:
        base = next((b for b in runs if b["system"] == "sb3_subproc" and b["steps"] == r["steps"]
                     and "learn_seconds" in b), None)
        if base and "learn_seconds" in r:
            r["vs_sb3_subproc"] = base["learn_seconds"] / r["learn_seconds"]
            r["vs_sb3_subproc_with_wrap"] = base["learn_seconds"] / (r["learn_seconds"] + r.get("wrap_seconds", 0.0))
            # The user's whole script: building the model (its VecEnv's processes: plain SB3's
            # SubprocVecEnv starts its 32 there), the wrap, learn.
            whole = r.get("build_seconds", 0.0) + r.get("wrap_seconds", 0.0) + r["learn_seconds"]
            r["vs_sb3_subproc_script"] = (base.get("build_seconds", 0.0) + base["learn_seconds"]) / whole


def _estimate(kind: str, steps: int, runs: list[dict]) -> float:
    """Seconds a run should take, from this run's earlier ones: a learn at fewer steps scaled
    by the steps for SB3 and the fixed layout; for an online wrap, its shorter run plus the
    extra steps at the fixed layout's or SB3's rate (the search was paid in the shorter run).
    0 when nothing is known yet (the first runs always run)."""
    def total(r: dict) -> float:
        return r.get("build_seconds", 0.0) + r.get("wrap_seconds", 0.0) + r.get("learn_seconds", 0.0)

    same = [r for r in runs if r["system"] == kind and "learn_seconds" in r]
    if not same:
        return 0.0
    prev = max(same, key=lambda r: r["steps"])
    scale = steps / prev["steps"]
    if kind in ("sb3_subproc", "fixed"):
        return total(prev) + prev["learn_seconds"] * (scale - 1)
    rate = [r for r in runs if r["system"] in ("fixed", "sb3_subproc") and r["steps"] == prev["steps"]
            and "learn_seconds" in r]
    per = min(r["learn_seconds"] for r in rate) if rate else prev["learn_seconds"]
    return total(prev) + 1.2 * per * (scale - 1)


def _brief(r: dict) -> str:
    if "error" in r:
        return f"{r['system']}: error {r['error']}"
    if "refused" in r:
        return f"{r['system']}: refused ({r['refused']})"
    t = r.get("tuner") or {}
    return (f"{r['system']}: learn {r['learn_seconds']:.1f} s (build {r['build_seconds']:.1f} s, wrap "
            f"{r.get('wrap_seconds', 0.0):.1f} s), layout {r.get('layout')}"
            + (f", locked {t.get('locked')} at collect {t.get('locked_at_collect')}" if t else ""))


# -- part 2: collection only
def _ceiling_main(make_env: Callable[[], Any], num_envs: int, seed: int, conn: Any) -> None:
    """One process of the envs-only ceiling: ``num_envs`` envs stepped with random actions
    (auto-reset at an episode's end), ``steps`` rows per command; answers with its steps and
    its start and end times (CLOCK_MONOTONIC: the same clock in every process)."""
    import numpy as np

    envs = [make_env() for _ in range(num_envs)]
    rng = np.random.default_rng(seed)
    try:
        for i, e in enumerate(envs):
            e.reset(seed=seed * 1000 + i)
            e.action_space.seed(seed * 1000 + i)
        n = envs[0].action_space.n
        conn.send("ready")
        while True:
            steps = conn.recv()
            if steps is None:
                return
            t0 = time.perf_counter()
            for _ in range(steps):
                for e, a in zip(envs, rng.integers(0, n, num_envs)):
                    _, _, term, trunc, _ = e.step(int(a))
                    if term or trunc:
                        e.reset()
            conn.send((steps * num_envs, t0, time.perf_counter()))
    finally:
        for e in envs:
            e.close()


class Ceiling(ChildRates):
    """The envs alone: ``procs`` processes (one per core), each stepping its share of the
    envs with random actions, all at once, nothing shared; ``run`` returns their steps over
    the wall time from the first start to the last end (bench/ceiling.py's way, without a
    policy)."""

    def __init__(self, make_env: Callable[[], Any], num_envs: int, procs: int):
        procs = max(1, min(procs, num_envs))
        ctx = mp.get_context("forkserver")
        self.conns, self.procs = [], []
        shares = [num_envs // procs + (k < num_envs % procs) for k in range(procs)]
        try:
            for k, n in enumerate(shares):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_ceiling_main, args=(make_env, n, k, child), daemon=True)
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
            for c in self.conns:
                if c.recv() != "ready":
                    raise RuntimeError("an envs-only process failed to start")
        except BaseException:
            self.close()
            raise
        self.settings = {"processes": procs, "envs_per_process": shares}

    def run(self, num_steps: int) -> float:
        return self._rate(num_steps)



def _policy(s: dict[str, Any], device: str) -> Any:
    """The collection policy (Nature CNN on Pong, the MLP on CartPole) as an :class:`auturi.TorchPolicy`."""
    import gymnasium as gym

    from auturi.nets import MLPActorCritic, NatureCNNActorCritic
    from auturi.policy import TorchPolicy

    if s["env"] == "pong":
        return TorchPolicy(functools.partial(NatureCNNActorCritic, 4, 6), gym.spaces.Discrete(6), device=device)
    return TorchPolicy(functools.partial(MLPActorCritic, 4, 2), gym.spaces.Discrete(2), device=device)


def _busy_jiffies() -> tuple[int, int] | None:
    """This machine's busy and total CPU time so far (``/proc/stat``, all cores; None off Linux)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(v) - v[3] - v[4], sum(v)  # less idle and iowait


def _sample(runner: Any, s: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """One warm collect (untimed), then ``collect_samples`` timed ones: their rates' summary
    and how many cores the machine kept busy meanwhile (its median; None off Linux), so a
    table shows whether a system was short of cores or left them idle."""
    runner.run(s["collect_steps"])
    rates, busy = [], []
    for _ in range(s["collect_samples"]):
        a = _busy_jiffies()
        rates.append(runner.run(s["collect_steps"]))
        b = _busy_jiffies()
        if a and b and b[1] > a[1]:
            busy.append((b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1))
    return summarize(rates), (sorted(busy)[len(busy) // 2] if busy else None)


def _measure(part: str, rows: dict[str, dict], skipped: list[str], clock: "Clock", s: dict[str, Any], name: str,
             build: Callable[[], Any], est: float, extra: Callable[[Any], dict] | None = None) -> None:
    """Build one system, :func:`_sample` it (``s``'s ``collect_steps`` and ``collect_samples``)
    and close it into ``rows[name]`` (its error instead, if it fails); skipped, and named in
    ``skipped``, when ``est`` seconds would overrun the budget."""
    if not clock.allows(est):
        skipped.append(f"{name} (estimated {est:.0f} s, {clock.left():.0f} s left)")
        print(f"{part}: skipped {skipped[-1]}", flush=True)
        return
    print(f"{part}: {name} ...", flush=True)
    runner, t0 = None, time.perf_counter()
    try:
        runner = build()
        rates, busy = _sample(runner, s)
        rows[name] = {"steps_per_second": rates, "busy_cores": busy, "settings": getattr(runner, "settings", None)}
        if extra is not None:
            rows[name].update(extra(runner))
    except Exception as e:
        rows[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    finally:
        if runner is not None:
            runner.close()
    rows[name]["seconds"] = time.perf_counter() - t0
    sps = rows[name].get("steps_per_second")
    print(f"   {name}: " + (f"{sps['median']:,.0f} steps/s" if sps else rows[name]["error"]), flush=True)


def part2(s: dict[str, Any], clock: "Clock") -> dict[str, Any]:
    """The collection systems one after another, each built, sampled and closed before the
    next starts (so no two hold the cores at once)."""
    from auturi.executor.layout import plan_layout
    from bench.peers import AuturiRunner, PeerRunner

    make_env = make_pong if s["env"] == "pong" else make_cartpole
    n, T = s["collect_envs"], s["collect_steps"]
    rows: dict[str, dict] = {}
    skipped: list[str] = []

    measure = functools.partial(_measure, "part 2", rows, skipped, clock, s)
    measure("envs_only", lambda: Ceiling(make_env, n, s["ceiling_procs"]), 15)
    # SB3's SubprocVecEnv with its default start method (forkserver), the policy in this process
    # on the model's device: what SB3's PPO does on a GPU.
    measure("sb3_subproc", lambda: PeerRunner("subproc", make_env, n, _policy(s, s["device"]),
                                              start_method="forkserver"), 20)
    tuned: dict[str, Any] = {}
    if clock.allows(s["tune_seconds"] + 20):
        print(f"part 2: auturi.tune ({s['tune_seconds']:.0f} s budget) ...", flush=True)
        try:
            tuned = tune(make_env, s)
        except Exception as e:
            tuned = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print("   tuned: " + (tuned.get("choice") or tuned.get("error", "")), flush=True)
    else:
        skipped.append(f"auturi.tune ({s['tune_seconds']:.0f} s budget, {clock.left():.0f} s left)")
    if "config" in tuned:
        cfg = tuned.pop("config")
        measure("auturi_tuned", lambda: AuturiRunner(make_env, _policy(s, "cpu"), n, cfg, warmup_steps=0), 15,
                lambda r: {"config": str(cfg)})
    ov = _config(s["overlap"])
    plan = plan_layout(ov)
    measure("auturi_overlap", lambda: AuturiRunner(make_env, _policy(s, "cpu"), n, ov, warmup_steps=0), 15,
            lambda r: {"config": str(ov), "overlap": [a.overlap for a in plan.actors]})
    sp = _config(s["spread"])
    lanes = [q.cpus[0] for q in plan_layout(sp).processes if q.kind in ("actor", "env") and q.cpus]
    measure("auturi_spread", lambda: AuturiRunner(make_env, _policy(s, "cpu"), n, sp, warmup_steps=0), 15,
            lambda r: {"config": str(sp), "lane_cores": len(set(lanes))})
    base = (rows.get("sb3_subproc") or {}).get("steps_per_second")
    ceil = (rows.get("envs_only") or {}).get("steps_per_second")
    for r in rows.values():
        sps = r.get("steps_per_second")
        if sps and base:
            r["vs_sb3_subproc"] = sps["median"] / base["median"]
        if sps and ceil:
            r["vs_envs_only"] = sps["median"] / ceil["median"]
    t = rows.get("auturi_tuned")
    if t and t.get("steps_per_second") and tuned.get("predicted"):
        tuned["measured_here"] = t["steps_per_second"]["median"]
        tuned["predicted_over_measured"] = tuned["predicted"] / t["steps_per_second"]["median"]
    return {"settings": {k: s[k] for k in ("env", "device", "collect_envs", "collect_steps", "collect_samples",
                                           "ceiling_procs", "tune_seconds", "tune_devices", "overlap",
                                           "spread")},
            "systems": rows, "tune": tuned, "skipped": skipped}


def tune(make_env: Callable[[], Any], s: dict[str, Any]) -> dict[str, Any]:
    """``auturi.tune`` over cpu and cuda for the collection workload (no cache: a fresh
    search), its choice and what it predicted and measured for it, and its limit line."""
    import auturi

    rep = auturi.tune(make_env, policy=_policy(s, "cpu"), num_envs=s["collect_envs"], num_steps=s["collect_steps"],
                      budget_seconds=s["tune_seconds"], devices=s["tune_devices"], cache=False)
    return _tune_record(rep)


def _tune_record(rep: Any) -> dict[str, Any]:
    """A :class:`auturi.TuneReport` as a record: its choice (``config``, popped before writing),
    what it predicted and measured for it, its limit line and its trials."""
    choice = rep.choice
    pred = [t.predicted for t in rep.trials if t.config == choice and t.predicted]
    try:  # the whole record (its profile, the fit, every sample): the model is re-checked from it offline
        whole = rep.to_record()
    except Exception as e:  # noqa: BLE001 - a bench's extra, never its failure
        whole = {"error": f"{type(e).__name__}: {e}"}
    return {"config": choice, "choice": str(choice), "tuner_measured": rep.throughput,
            "predicted": pred[0] if pred else None, "limit": rep.limit, "limit_share": rep.limit_share(),
            "reason": rep.reason, "seconds": rep.seconds,
            "trials": [{"config": str(t.config), "source": t.source, "estimate": t.estimate, "predicted": t.predicted,
                        "status": t.status} for t in rep.trials], "record": whole}


# -- part 3: C++ vector env (ale-py's AtariVectorEnv)
SMOKE_ALE_LAYOUTS = ["1,4,1,1,cpu,4"]
"""Part 3's layout in a smoke run: the last of :data:`ALE_LAYOUTS` (1 actor), tiny and on cpu. Only the
one whose actor runs in this process: a layout with actor processes took 12 s more on a loaded
2-core machine (2026-11-26), and runs the same code here (``--ale-layouts 2,2,1,1,cpu,2`` adds it)."""
SMOKE_ALE_TUNE = 0.0
"""Part 3's tune in a smoke run: none (0: skipped, named), to keep the run a few seconds."""


def _ale_unavailable() -> str | None:
    """Why part 3 cannot run here (ale-py missing, or too old for ``AtariVectorEnv``), or None."""
    from auturi.envs.ale_vector import INSTALL, ale_vector_available

    if ale_vector_available():
        return None
    return f"ale-py's AtariVectorEnv cannot be imported here (ale-py is missing or older than 0.11): {INSTALL}"


class AleAlone:
    """ale-py's ``AtariVectorEnv`` alone, driven as its documentation does: ``num_envs`` envs
    in sync mode (``batch_size == num_envs``), ``num_threads`` C++ threads, its own NEXT_STEP
    auto-reset; ``run(T)`` is ``T`` batches of send/recv with the policy acting on each batch
    in this process (``policy`` None: uniform random actions, no policy: the envs' ceiling)."""

    def __init__(self, game: str, num_envs: int, num_threads: int, policy: Any = None, seed: int = 0):
        import numpy as np
        from ale_py.vector_env import AtariVectorEnv

        self.env = AtariVectorEnv(game, num_envs, batch_size=num_envs, num_threads=num_threads)
        self.policy, self.n = policy, num_envs
        self.num_actions = int(self.env.single_action_space.n)
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.settings = {"game": game, "num_envs": num_envs, "batch_size": num_envs, "num_threads": num_threads,
                         "policy": None if policy is None else str(getattr(policy, "device", "?"))}

    def run(self, num_steps: int) -> float:
        import numpy as np

        from bench.common import act

        env, rng = self.env, self.rng
        t0 = time.perf_counter()
        for _ in range(num_steps):
            if self.policy is None:
                a = rng.integers(0, self.num_actions, self.n)
            else:  # AtariVectorEnv.send takes int32/int64 arrays of batch_size actions
                a = np.asarray(act(self.policy, self.obs, rng), dtype=np.int64).reshape(self.n)
            env.send(a)
            self.obs, *_ = env.recv()
        return num_steps * self.n / (time.perf_counter() - t0)

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()
            # AtariVectorEnv.close leaves its C++ vectorizer to the garbage collector; dropping
            # it now joins its threads before the next system takes the cores.
            env.__dict__.pop("ale", None)


def _layout_key(cfg: Any) -> str:
    """``auturi_ale_2x32_d1``: a part-3 row's name for a layout."""
    return f"auturi_ale_{cfg.num_actors}x{cfg.envs_per_actor}_d{cfg.env_parallel_degree}"


def lockstep_space(num_envs: int, devices: list[str], cores: int | None = None) -> Any:
    """``auturi.build_space(num_envs)`` less every layout whose actors do not all run the
    lockstep loop (each moved to ``pruned`` with why): the layouts that keep each runner's
    envs in one ``AtariVectorEnv`` (see :data:`ALE_LAYOUTS`)."""
    import dataclasses

    from auturi import build_space
    from auturi.executor.layout import plan_layout

    space = build_space(num_envs, cores=cores, devices=devices)
    keep, drop = [], []
    for c in space.configs:
        (keep if all(a.lockstep for a in plan_layout(c).actors) else drop).append(c)
    why = "not lockstep: a step would name only some of a runner's envs and split its AtariVectorEnv"
    return dataclasses.replace(space, configs=keep, pruned=list(space.pruned) + [(c, why) for c in drop])


def tune_ale(env_id: str, s: dict[str, Any], start: Any) -> dict[str, Any]:
    """``auturi.tune(env_id)`` (no cache) over :func:`lockstep_space` on ``ale_device``,
    starting from ``start``; its record (:func:`_tune_record`) and the space's size."""
    import auturi

    space = lockstep_space(s["ale_envs"], [s["ale_device"]])

    def lockstep_only(tuner: Any, executor: Any) -> None:
        # auturi.tune takes no space; its Tuner does (``space=``), and builds its own only when
        # it has none when the search begins, which is after this hook.
        tuner.space = space

    rep = auturi.tune(env_id, policy=_policy({"env": "pong"}, "cpu"), num_envs=s["ale_envs"],
                      num_steps=s["ale_steps"], budget_seconds=s["ale_tune_seconds"], devices=[s["ale_device"]],
                      start=start, cache=False, on_start=lockstep_only)
    return {**_tune_record(rep), "space": len(space),
            "pruned_not_lockstep": sum(1 for _, why in space.pruned if why.startswith("not lockstep"))}


def part3(s: dict[str, Any], clock: "Clock") -> dict[str, Any]:
    """The vector env alone (random actions; the policy on every batch), then Auturi on
    ``ale:GAME`` in each lockstep layout, then a short lockstep-only tune and its choice; each
    built, sampled and closed before the next (as part 2)."""
    st = {k: s[k] for k in ("ale_game", "ale_envs", "ale_steps", "ale_samples", "ale_device", "ale_threads",
                            "ale_layouts", "ale_tune_seconds")}
    why = _ale_unavailable()
    if why:
        print(f"part 3: skipped: {why}", flush=True)
        return {"settings": st, "unavailable": why, "systems": {}, "tune": {}, "skipped": []}
    from bench.peers import AuturiRunner

    game, n, dev, threads = s["ale_game"], s["ale_envs"], s["ale_device"], s["ale_threads"]
    env_id = "ale:" + game
    rows: dict[str, dict] = {}
    skipped: list[str] = []
    pong = {"env": "pong"}  # _policy's Nature CNN (4 frames, 6 actions: Pong's minimal action set)
    measure = functools.partial(_measure, "part 3", rows, skipped, clock,
                                {"collect_steps": s["ale_steps"], "collect_samples": s["ale_samples"]})
    measure("ale_envs_only", lambda: AleAlone(game, n, threads), 10)
    measure("ale_alone", lambda: AleAlone(game, n, threads, _policy(pong, dev)), 10)
    layouts = [_config(t) for t in s["ale_layouts"]]
    for cfg in layouts:
        name = _layout_key(cfg)
        while name in rows:  # two layouts with one name (they differ in a knob the name leaves out)
            name += "+"
        measure(name, lambda cfg=cfg: AuturiRunner(env_id, _policy(pong, "cpu"), n, cfg, warmup_steps=0), 15,
                lambda r, cfg=cfg: {"config": str(cfg)})
    tuned: dict[str, Any] = {}
    if s["ale_tune_seconds"] <= 0:
        skipped.append("auturi.tune (no tune asked: --ale-tune-seconds 0)")
    elif clock.allows(s["ale_tune_seconds"] + 20):
        print(f"part 3: auturi.tune({env_id!r}), lockstep layouts, {s['ale_tune_seconds']:.0f} s ...", flush=True)
        try:
            tuned = tune_ale(env_id, s, layouts[0] if layouts else None)
        except Exception as e:
            tuned = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print("   tuned: " + (tuned.get("choice") or tuned.get("error", "")), flush=True)
    else:
        skipped.append(f"auturi.tune ({s['ale_tune_seconds']:.0f} s budget, {clock.left():.0f} s left)")
    if "config" in tuned:
        cfg = tuned.pop("config")
        measure("auturi_ale_tuned", lambda: AuturiRunner(env_id, _policy(pong, "cpu"), n, cfg, warmup_steps=0), 15,
                lambda r: {"config": str(cfg)})
        t = rows.get("auturi_ale_tuned") or {}
        if t.get("steps_per_second") and tuned.get("predicted"):
            tuned["measured_here"] = t["steps_per_second"]["median"]
            tuned["predicted_over_measured"] = tuned["predicted"] / tuned["measured_here"]
    alone = (rows.get("ale_alone") or {}).get("steps_per_second")
    ceil = (rows.get("ale_envs_only") or {}).get("steps_per_second")
    for r in rows.values():
        sps = r.get("steps_per_second")
        if sps and alone:
            r["vs_ale_alone"] = sps["median"] / alone["median"]
        if sps and ceil:
            r["vs_envs_only"] = sps["median"] / ceil["median"]
    return {"settings": st, "systems": rows, "tune": tuned, "skipped": skipped}


# -- the machine, the budget, the records
class Clock:
    """The run's time budget: ``allows(est)`` when ``est`` seconds more still end within it."""

    def __init__(self, budget: float):
        self.t0, self.budget = time.perf_counter(), budget

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def allows(self, est: float) -> bool:
        return est <= self.left()


def machine_facts(smoke: bool) -> dict[str, Any]:
    """GPU (by name; read after SB3/auturi started CUDA, so this starts nothing of its own
    on a GPU run), cores, versions, the project's commit."""
    import gymnasium
    import torch

    facts: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                             "platform": platform.platform()}
    try:
        facts["usable_cores"] = len(os.sched_getaffinity(0))
    except AttributeError:
        facts["usable_cores"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            facts["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        facts["cpu"] = None
    facts["gpu"] = torch.cuda.get_device_name(0) if not smoke and torch.cuda.is_available() else None
    vers = {"torch": torch.__version__, "gymnasium": gymnasium.__version__}
    for mod in ("stable_baselines3", "ale_py", "auturi", "numpy"):
        try:
            vers[mod] = __import__(mod).__version__
        except Exception as e:  # not installed (ale_py on a smoke machine): say so
            vers[mod] = f"unavailable ({type(e).__name__})"
    facts["versions"] = vers
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        facts["git_commit"] = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                                             text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        facts["git_dirty"] = bool(dirty) if facts["git_commit"] else None
    except (OSError, subprocess.SubprocessError):
        facts["git_commit"] = None
    return facts


def _c(text: Any) -> str:
    """A config's text in a table cell (its own ``|`` would split the cell)."""
    return str(text).replace("|", "/")


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def summary(part1_rec: dict | None, part2_rec: dict | None, machine: dict, command: str,
            part3_rec: dict | None = None) -> str:
    """The markdown summary of the parts' records (any may be None: not run)."""
    gpu = machine.get("gpu") or "no GPU"
    v = machine.get("versions", {})
    lines = [f"# bench.gpu ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"Machine: {gpu}, {machine.get('usable_cores')} cores ({machine.get('cpu')}); "
             + ", ".join(f"{k} {val}" for k, val in v.items())
             + f"; commit {machine.get('git_commit') or 'unknown'}" + (" (dirty)" if machine.get("git_dirty") else ""),
             f"Command: `{command}`", ""]
    if part1_rec is not None:
        lines += _part1_md(part1_rec)
    if part2_rec is not None:
        lines += _part2_md(part2_rec)
    if part3_rec is not None:
        lines += _part3_md(part3_rec)
    return "\n".join(lines) + "\n"


def _part1_md(rec: dict) -> list[str]:
    if "error" in rec:
        return ["## Part 1: SB3 PPO end to end", "", f"Failed: {rec['error']}", ""]
    st = rec["settings"]
    steps = st["steps"]
    out = ["## Part 1: SB3 PPO end to end",
           f"{st['n_envs']} envs, n_steps {st['n_steps']}, batch {st['batch_size']}, {st['n_epochs']} epochs, "
           f"device {st['device']}; `learn` seconds (x: plain SB3 SubprocVecEnv's over it, same run; "
           "in brackets: with the wrap's own seconds counted; then the whole script, building the model and "
           "the wrap counted, against plain SB3's building and learn)", "",
           "| run | " + " | ".join(f"{n:,} steps" for n in steps) + " |", "|---|" + "---:|" * len(steps)]
    for kind in SYSTEMS_1:
        cells = []
        for n in steps:
            r = next((r for r in rec["runs"] if r["system"] == kind and r["steps"] == n), None)
            if r is None:
                cells.append("skipped" if any(x.startswith(f"{kind} at {n:,}") for x in rec["skipped"]) else "-")
            elif "error" in r:
                cells.append(f"error: {r['error'][:80]}")
            elif "refused" in r:
                cells.append(f"refused ({r['refused'].split(':')[0]})")
            else:
                c = f"{r['learn_seconds']:.1f}"
                if kind != "sb3_subproc":
                    c += (f" ({_f(r.get('vs_sb3_subproc'), '{:.2f}x')}; {_f(r.get('vs_sb3_subproc_with_wrap'), '{:.2f}x')}; "
                          f"script {_f(r.get('vs_sb3_subproc_script'), '{:.2f}x')})")
                    c += f", ended at {r.get('layout')}"
                cells.append(c.replace("|", "/"))
        label = LABELS_1[kind].format(rec["settings"]["fixed"]) if kind == "fixed" else LABELS_1[kind]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    if rec["skipped"]:
        out += ["", "Skipped (time budget): " + "; ".join(rec["skipped"]) + ". To measure them: "
                "`python -m bench.gpu --parts 1 --steps N --out DIR` (every system at N steps)."]
    phases = [r for r in rec["runs"] if r.get("wrap_phases")]
    if phases:
        out += ["", "Where each wrap's seconds went (`model.auturi.wrap_seconds`):", "",
                "| run | steps | envs rebuilt | executor started | wrap-time look | of it, moves | total |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for r in phases:
            w = r["wrap_phases"]
            out.append(f"| {r['system']} | {r['steps']:,} | " + " | ".join(
                _f(w.get(k)) for k in ("envs", "executor", "tuner", "moves", "total")) + " |")
    for r in rec["runs"]:
        if r.get("rollouts") and r.get("tuner"):
            t = r["tuner"]
            fr = t.get("first_run") or {}
            out += ["", f"Online tuner's moves, {r['system']} at {r['steps']:,} steps: locked in "
                    f"{t.get('locked') or 'never'} at collect {t.get('locked_at_collect')}; reconfigures "
                    f"{fr.get('reconfigures')} ({_f(fr.get('reconfigure_seconds'))} s), seconds off the choice "
                    f"{_f(fr.get('seconds_off_choice'))}", "",
                    "| rollout | layout it ran | seconds | moves in it (to, seconds) | phase after |",
                    "|---:|---|---:|---|---|"]
            for row in r["rollouts"]:
                mv = "; ".join(f"{m['to']} ({m['seconds']:.2f} s)" for m in row["moves"]) or "-"
                out.append(f"| {row['rollout']} | {_c(row['config'])} | {row['seconds']:.2f} | {_c(mv)} | {row['phase']} |")
    return out + [""]


def _system_row(label: str, r: dict, versus: str) -> str:
    """One system's table row: its median rate, its ratio ``versus`` its peer, its share of the
    envs-only ceiling (or its error)."""
    label = label.replace("|", "/")
    if "error" in r:
        return f"| {label} | error: {r['error'][:80]} | - | - | - |"
    return (f"| {label} | {r['steps_per_second']['median']:,.0f} | {_f(r.get(versus), '{:.2f}x')} "
            f"| {_f(r.get('vs_envs_only'), '{:.0%}')} | {_f(r.get('busy_cores'), '{:.1f}')} |")


def _part2_md(rec: dict) -> list[str]:
    if "error" in rec:
        return ["## Part 2: collection only", "", f"Failed: {rec['error']}", ""]
    st = rec["settings"]
    out = ["## Part 2: collection only",
           f"{st['env']}, {st['collect_envs']} envs x {st['collect_steps']} steps per collect; median of "
           f"{st['collect_samples']} collects after a warm one", "",
           "| system | steps/s | vs SB3 SubprocVecEnv | vs envs only | cores busy |", "|---|---:|---:|---:|---:|"]
    names = {"envs_only": f"envs only ({st['ceiling_procs']} processes, random actions)",
             "sb3_subproc": "SB3 SubprocVecEnv (forkserver), policy in the main process",
             "auturi_tuned": "Auturi tuned", "auturi_overlap": "Auturi overlapped",
             "auturi_spread": "Auturi, several actors"}
    for k, r in rec["systems"].items():
        label = names.get(k, k) + (f": {r['config']}" if r.get("config") else "")
        if r.get("overlap") is not None:
            label += f" (overlap {r['overlap']})"
        if r.get("lane_cores") is not None:
            label += f" (lanes on {r['lane_cores']} cores)"
        out.append(_system_row(label, r, "vs_sb3_subproc"))
    t = rec.get("tune") or {}
    out += _tune_md(t, f"{st['tune_seconds']:.0f} s, devices {', '.join(st['tune_devices'])}", t.get("choice"),
                    f" (predicted / measured here {_f(t.get('predicted_over_measured'), '{:.2f}')})")
    if rec["skipped"]:
        out += ["", "Skipped (time budget): " + "; ".join(rec["skipped"])]
    return out + [""]


def _tune_md(t: dict, what: str, choice: Any, extra: str = "") -> list[str]:
    """The lines on a part's ``auturi.tune`` run (none when it did not run): its choice, the
    model's prediction, what the tuner and this bench measured, and its limit."""
    if "error" in t:
        return ["", f"auturi.tune failed: {t['error']}"]
    if not t:
        return []
    lim = t.get("limit") or {}
    return ["", f"Tuner ({what}): chose {choice}; predicted {_f(t.get('predicted'), '{:,.0f}')} steps/s, "
            f"measured by the tuner {_f(t.get('tuner_measured'), '{:,.0f}')}, here "
            f"{_f(t.get('measured_here'), '{:,.0f}')}{extra}; its limit {_f(lim.get('steps_per_second'), '{:,.0f}')} "
            f"steps/s (share {_f(t.get('limit_share'), '{:.0%}')})"]


def _part3_md(rec: dict) -> list[str]:
    title = "## Part 3: C++ vector env (ale-py's AtariVectorEnv)"
    if "error" in rec:
        return [title, "", f"Failed: {rec['error']}", ""]
    if rec.get("unavailable"):
        return [title, "", f"Not run: {rec['unavailable']}", ""]
    st = rec["settings"]
    out = [title,
           f"ale:{st['ale_game']} (AtariVectorEnv's own preprocessing: 84x84 grey, frame skip 4, 4 frames), "
           f"{st['ale_envs']} envs x {st['ale_steps']} steps per collect, Nature CNN on {st['ale_device']}; median "
           f"of {st['ale_samples']} collects after a warm one", "",
           "| system | steps/s | vs AtariVectorEnv alone | vs its envs only | cores busy |", "|---|---:|---:|---:|---:|"]
    names = {"ale_envs_only": f"AtariVectorEnv alone, random actions ({st['ale_threads']} threads): envs only",
             "ale_alone": f"AtariVectorEnv alone, policy on every batch ({st['ale_threads']} threads, batch "
                          f"{st['ale_envs']})",
             "auturi_ale_tuned": f"Auturi on ale:{st['ale_game']}, tuned (lockstep layouts)"}
    for k, r in rec["systems"].items():
        label = names.get(k, f"Auturi on ale:{st['ale_game']}" if k.startswith("auturi_ale") else k)
        out.append(_system_row(label + (f": {r['config']}" if r.get("config") else ""), r, "vs_ale_alone"))
    t = rec.get("tune") or {}
    out += _tune_md(t, f"{st['ale_tune_seconds']:.0f} s, {t.get('space')} lockstep layouts on {st['ale_device']}",
                    _c(t["choice"]) if "choice" in t else None)
    if rec["skipped"]:
        out += ["", "Skipped: " + "; ".join(rec["skipped"])]
    return out + [""]


def _write(path: str, rec: dict) -> None:
    with open(path, "w") as f:
        json.dump(rec, f, indent=1, default=str)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the records (made if missing)")
    ap.add_argument("--smoke", action="store_true", help="everything tiny on cpu (CartPole in part 1 without ale-py)")
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    ap.add_argument("--steps", type=int, nargs="+", default=None,
                    help="part 1's learn lengths (default 32768 98304; smoke 128 256)")
    ap.add_argument("--long-systems", nargs="+", default=["sb3_subproc", "wrap_dummy"], choices=SYSTEMS_1,
                    help="part 1's systems run at the step counts after the first (default: plain SB3 and the "
                         "default wrap; the others only when named)")
    ap.add_argument("--fixed", default=None, help=f"part 1's fixed layout, six fields (default {FIXED})")
    ap.add_argument("--overlap", default=None, help=f"part 2's overlapped layout (default {OVERLAP})")
    ap.add_argument("--spread", default=None, help=f"part 2's several-actor layout (default {SPREAD})")
    ap.add_argument("--ale-layouts", nargs="+", default=None,
                    help=f"part 3's Auturi layouts on ale:pong, six fields each (default {' '.join(ALE_LAYOUTS)})")
    ap.add_argument("--ale-tune-seconds", type=float, default=None,
                    help="part 3's lockstep-only auturi.tune budget (default 20; smoke 0; 0 = no tune)")
    ap.add_argument("--ceiling-procs", type=int, default=16, help="processes of the envs-only ceiling")
    ap.add_argument("--budget-seconds", type=float, default=330.0,
                    help="skip a run that would end after this many seconds of the whole script (default 330: "
                         "the script's 6 minutes less its start)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.budget_seconds)
    s = settings(args)
    command = "python -m bench.gpu " + " ".join(sys.argv[1:] if argv is None else argv)
    import torch

    if args.smoke:
        torch.set_num_threads(1)  # the smoke check shares a small machine
    recs: dict[int, dict] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    facts: dict[str, Any] = {}

    def flush() -> None:
        # After each part, so a run stopped from outside (a device call's time limit) still
        # leaves the parts it finished on disk. The machine's facts are read at the first
        # flush, after part 1 started CUDA (see machine_facts).
        if not facts:
            facts.update(machine_facts(args.smoke))
        machine = facts
        for p, name in ((1, "part1_sb3_ppo.json"), (2, "part2_collect.json"), (3, "part3_ale_vector.json")):
            if p in recs:
                _write(os.path.join(args.out, name), {"machine": machine, "command": command, "written": started,
                                                      "smoke": args.smoke, **recs[p]})

    order = [p for p in (1, 2, 3) if p in args.parts]
    # Part 1 at its first step count, then part 2, then part 1's longer runs, then part 3:
    # the SB3 recipe at both lengths is what the GPU targets are read from (issue 32), so a
    # short budget cuts part 3 (a comparison with ale-py's own vector env) first.
    p1_long = s["steps"][1:]
    if 1 in order:
        try:
            recs[1] = part1({**s, "steps": s["steps"][:1]}, clock, args.long_systems, s["steps"][0])
        except Exception as e:
            recs[1] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        flush()
    if 2 in order:
        try:
            recs[2] = part2(s, clock)
        except Exception as e:
            recs[2] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        flush()
    if 1 in order and p1_long and "error" not in recs[1]:
        try:
            more = part1({**s, "steps": p1_long}, clock, args.long_systems, s["steps"][0], recs[1]["runs"])
            recs[1] = {"settings": {**recs[1]["settings"], "steps": s["steps"]}, "runs": recs[1]["runs"] + more["runs"],
                       "skipped": recs[1]["skipped"] + more["skipped"]}
        except Exception as e:
            recs[1]["error_long"] = f"{type(e).__name__}: {e}"
        flush()
    if 3 in order:
        try:
            recs[3] = part3(s, clock)
        except Exception as e:
            recs[3] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    flush()
    machine = facts
    md = summary(recs.get(1), recs.get(2), machine, command, recs.get(3))
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(md)
    print()
    print(md, flush=True)
    return {"machine": machine, "parts": recs, "summary": md}


if __name__ == "__main__":
    main()
