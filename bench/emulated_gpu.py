"""The emulated GPU box (issue 32 item 3; issue 33's emulated targets): the regime of a 16-core
machine with one GPU (Pong, the Nature CNN, 32-64 envs), emulated on 2 cores with
:mod:`auturi.testing` (see its modules' docstrings for what is emulated and its calibration).

For each step-time profile (``pong-like``, ``straggler``), in interleaved rounds:

- ``envs_only``: the envs alone, free-running: one process per emulated simulator core, each
  stepping its share of the envs with a fixed action, no policy and no barrier between them:
  the envs' wall-clock rate if inference cost nothing, measured on this machine (the ceiling).
  ``ceiling_model`` beside it is the emulated machine's own: ``min(envs, sim cores) / mean
  step time``; ``auturi_free_policy`` (not in ``--quick``) is Auturi's lockstep layout of one
  env worker per simulator core with a policy that costs nothing;
- ``sb3_subproc``: SB3's ``SubprocVecEnv`` (fork), the emulated device policy called in this
  process on a batch of all the envs, as SB3's PPO ``collect_rollouts`` does with its model
  on a GPU (less its buffer writes). A real SB3 PPO with a torch MLP would time the 2 real
  cores' MLP, not the emulated GPU, so it does not apply here;
- ``serial``: Auturi's serial layout, inference on the emulated device in this process;
- a few hand-picked Auturi layouts on the emulated device (``cuda``), one on the CPU; the
  table's ``loop`` column says which actor loop each runs (``lockstep``, ``overlapped``:
  env stepping overlapped with inference, ``general``; see ``auturi.executor.actor_loop``);
- with ``--overlap``: more overlapped layouts (two or four replicas, one env a worker, two
  actors) and the lockstep ones they compete with. On 2026-11-26 (2 cores shared with other
  jobs, 5 rounds) the best overlapped layout reached 60-66% of the envs' rate on
  ``pong-like`` (1 x 32, degree 32, 2 replicas of batch 16; the best lockstep one, 2 x 16,
  67-72%) and 69-75% on ``straggler`` (1 x 32, degree 32, 4 replicas of batch 8; the best
  lockstep one 42-45%);
- with ``--tune-seconds``: ``auturi.tune`` (offline) and its choice, planning for the
  emulated machine's cores (``--tune-cores``, default ``--sim-cores``: its process cap and
  model see the 16-core machine the envs step on, not the 2 real cores; then it searches
  ``cuda`` layouts only, since CPU inference runs on the real cores: :func:`tune_devices`);
  ``--tune-cores 0`` plans for this machine's cores, over ``cpu`` and ``cuda``.

Every system runs the same envs behind one :class:`~auturi.testing.emulated_sim.SimCores` pool
(16 emulated simulator cores by default) and the same policy. ``--time-scale`` multiplies every
emulated wait (steps, resets, forward passes; not the device's start cost): Auturi's own work
runs on the 2 real cores, 8x fewer than the emulated machine's, and a larger scale gives it
the share of a step it had there. The default, 4, put SB3's SubprocVecEnv at 43% of the envs'
rate and Auturi's 1 x 32, degree 16 at 1.08x SB3 on ``pong-like`` (2026-11-26, 2 cores), near
the GPU record's 29% and 1.21x (64 envs); at scale 1 (a ``--quick`` run) SB3 reached 26% and
that layout 3x SB3, its 32 pickling processes crowding the 2 real cores. Each system's
``start_seconds`` (building it, its first collect, and the device's start cost in each of its
processes) is recorded.

Run: python -m bench.emulated_gpu [--quick] [--overlap] [--profiles pong-like straggler] [--num-envs 32]
     [--time-scale 4] [--tune-seconds 40] [--out bench/results/emulated_gpu.json]
``--quick`` (under a minute on 2 cores): 32 envs, 32 steps, 2 rounds, fewer layouts, a 0.5 s
device start. ``--smoke``: 4 envs, a few steps, for the tests (its numbers mean nothing).
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

from bench.common import ChildRates, interleave, machine_header, save_and_print, summarize


def layouts(n: int, sim_cores: int, quick: bool, overlap: bool = False) -> dict[str, Any]:
    """The hand-picked Auturi layouts for ``n`` envs, their env workers sized to the emulated
    simulator's cores (names as the table prints them); ``overlap`` adds overlapped layouts
    (``ActorPlan.overlap``) and the lockstep ones they compete with."""
    from auturi import Config

    full = max(d for d in range(1, min(n, sim_cores) + 1) if n % d == 0)  # a worker per simulator core
    half = max(d for d in range(1, full // 2 + 1) if n % d == 0) if full > 1 else 1
    out = {
        "auturi_serial": Config.serial(n, "cuda"),
        f"auturi_1x{n}_d{half}": Config(1, n, half, 1, "cuda", n),
        f"auturi_1x{n}_d{full}": Config(1, n, full, 1, "cuda", n),
    }
    if n % 2 == 0:
        out[f"auturi_1x{n}_d{full}_2rep"] = Config(1, n, full, 2, "cuda", n // 2)
    if not quick and n % 2 == 0 and (n // 2) % half == 0:
        out[f"auturi_2x{n // 2}_d{half}"] = Config(2, n // 2, half, 1, "cuda", n // 2)
    if not quick:
        out[f"auturi_1x{n}_d{full}_cpu"] = Config(1, n, full, 1, "cpu", n)
    if overlap and n % 4 == 0:
        out[f"auturi_1x{n}_d{full}_4rep_b{n // 4}"] = Config(1, n, full, 4, "cuda", n // 4)
        out[f"auturi_1x{n}_d{n}_2rep_b{n // 2}"] = Config(1, n, n, 2, "cuda", n // 2)  # one env a worker
        out[f"auturi_1x{n}_d{n}_4rep_b{n // 4}"] = Config(1, n, n, 4, "cuda", n // 4)
        d2 = max(d for d in range(1, min(n // 2, sim_cores) + 1) if (n // 2) % d == 0)
        out[f"auturi_2x{n // 2}_d{d2}"] = Config(2, n // 2, d2, 1, "cuda", n // 2)  # lockstep, two actors
        out[f"auturi_2x{n // 2}_d{d2}_2rep_b{n // 4}"] = Config(2, n // 2, d2, 2, "cuda", n // 4)
    return out


def tune_devices(args: Any) -> list[str]:
    """The devices ``auturi.tune`` searches: ``cpu`` and ``cuda``, or only ``cuda`` when it
    plans for more cores than this machine has (``--tune-cores``): the emulation gives env
    steps the emulated machine's cores, but CPU inference runs on the real ones, so a plan
    for 16 cores would rank CPU layouts as if they had 16 (on 2026-11-26 it measured two
    such, predicted 6,800-8,000 steps/s, at 880-1,640, and ran out of budget)."""
    from auturi.resources import usable_cores

    beyond = bool(args.tune_cores) and args.tune_cores > usable_cores()
    return ["cuda"] if beyond else ["cpu", "cuda"]


def loop_of(config: Any) -> str:
    """Which actor loop ``config`` runs (the layout plan's choice)."""
    from auturi.executor.layout import plan_layout

    ap = plan_layout(config, cores=[0]).actors[0]
    return "lockstep" if ap.lockstep else "overlapped" if ap.overlap else "general"


def _free_main(env_fn: Any, num_envs: int, seed: int, conn: Any) -> None:
    """One free-running process: ``num_envs`` envs stepped one after another with action 0,
    on command, no policy and nothing shared; answers its steps and its start and end times."""
    envs = [env_fn() for _ in range(num_envs)]
    try:
        for i, e in enumerate(envs):
            e.reset(seed=seed + i)
        conn.send("ready")
        while True:
            rows = conn.recv()
            if rows is None:
                return
            t0 = time.perf_counter()
            for _ in range(rows):
                for e in envs:
                    _, _, term, trunc, _ = e.step(0)
                    if term or trunc:
                        e.reset()
            conn.send((rows * num_envs, t0, time.perf_counter()))
    finally:
        for e in envs:
            e.close()


class FreeEnvs(ChildRates):
    """The envs alone: ``procs`` processes each stepping its share of the envs as fast as they
    go, with no policy and no barrier between them (the envs' wall-clock rate if inference
    and synchronisation cost nothing). ``run`` has them all step ``num_steps`` rows at once and
    returns their steps over the wall time from the first start to the last end."""

    def __init__(self, env_fn: Any, num_envs: int, procs: int):
        import multiprocessing as mp

        if num_envs % procs:
            raise ValueError(f"{num_envs} envs do not split over {procs} processes")
        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        k = num_envs // procs
        for w in range(procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_free_main, args=(env_fn, k, w * k, child), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if c.recv() != "ready":
                raise RuntimeError("a free-running env process failed to start")

    def run(self, num_steps: int) -> float:
        return self._rate(num_steps)



class _Timed:
    """A runner and how long it took to build (its first, warm-up collect included)."""

    def __init__(self, build: Any):
        t0 = time.perf_counter()
        self.runner = build()
        self.start_seconds = time.perf_counter() - t0

    def run(self, num_steps: int, collects: int) -> float:
        return sum(self.runner.run(num_steps) for _ in range(collects)) / collects

    def close(self) -> None:
        self.runner.close()


def run_profile(profile: str, args: Any, pool_name: str) -> dict:
    import auturi
    from auturi.testing.emulated_gpu import EmulatedDevicePolicy
    from auturi.testing.emulated_sim import EmulatedSimEnv, get_profile
    from bench.peers import AuturiRunner, PeerRunner

    n, steps = args.num_envs, args.num_steps
    env = functools.partial(EmulatedSimEnv, profile, time_scale=args.time_scale, sim_cores=pool_name)
    prof = get_profile(profile)

    def policy(device: str = "cuda") -> EmulatedDevicePolicy:
        p = EmulatedDevicePolicy(prof.num_actions, time_scale=args.time_scale, context_seconds=args.context_seconds)
        p.to(device)  # this process's start cost, paid before anything is timed (a learner on the GPU has paid it)
        return p

    row: dict[str, Any] = {"profile": profile, "description": prof.description,
                           "mean_step_ms": prof.mean_step_seconds() * args.time_scale * 1e3,
                           "ceiling_model": min(n, args.sim_cores) / (prof.mean_step_seconds() * args.time_scale),
                           "configs": {}, "start_seconds": {}}
    runners: dict[str, _Timed] = {}
    try:
        procs = max(d for d in range(1, min(n, args.sim_cores) + 1) if n % d == 0)
        runners["envs_only"] = _Timed(lambda: FreeEnvs(env, n, procs))
        if not args.quick:  # Auturi's lockstep layout with inference that costs nothing
            cfg = auturi.Config(1, n, procs, 1, "cpu", n)
            row["configs"]["auturi_free_policy"] = str(cfg) + " (constant policy)"
            runners["auturi_free_policy"] = _Timed(lambda: AuturiRunner(
                env, auturi.ConstantPolicy(EmulatedSimEnv(profile).action_space), n, cfg, warmup_steps=steps))
        runners["sb3_subproc"] = _Timed(lambda: PeerRunner("subproc", env, n, policy(), warmup_steps=steps))
        chosen = dict(layouts(n, args.sim_cores, args.quick, args.overlap))
        if args.tune_seconds:
            t0 = time.perf_counter()
            report = auturi.tune(env, policy=policy("cpu"), num_envs=n, num_steps=steps,
                                 budget_seconds=args.tune_seconds, devices=tune_devices(args), cache=False,
                                 cores=args.tune_cores or None)
            chosen_trial = report.choice_trial
            row["tune"] = {"choice": str(report.config), "config": report.config.to_dict(),
                           "devices": tune_devices(args), "cores": args.tune_cores or None,
                           "seconds": time.perf_counter() - t0, "measured": report.throughput,
                           "predicted": getattr(chosen_trial, "predicted", None),
                           "limit": report.limit, "limit_share": report.limit_share(),
                           "trials": [{"config": str(t.config), "source": t.source, "median": t.estimate,
                                       "predicted": t.predicted} for t in report.trials]}
            print(f"{profile}: tuned in {row['tune']['seconds']:.0f} s: {report.config}", flush=True)
            chosen["auturi_tuned"] = report.config
        row["loops"] = {}
        for name, cfg in chosen.items():
            row["configs"][name] = str(cfg)
            row["loops"][name] = loop_of(cfg)
            device = "cpu" if cfg.policy_device == "cpu" else "cuda"
            runners[name] = _Timed(lambda c=cfg, d=device: AuturiRunner(env, policy(d), n, c, warmup_steps=steps))
        row["start_seconds"] = {k: r.start_seconds for k, r in runners.items()}
        samples = interleave(runners, args.rounds, lambda _name, r: r.run(steps, args.collects),
                             progress=lambda s: print(f"{profile}: {s}", flush=True))
    finally:
        for r in runners.values():
            r.close()
    peers = {k: summarize(v) for k, v in samples.items()}
    row["peers"] = peers
    row["envs_only"] = peers["envs_only"]["median"]
    sb3 = peers["sb3_subproc"]["median"]
    row["vs_sb3_subproc"] = {k: v["median"] / sb3 for k, v in peers.items() if k != "envs_only"}
    row["vs_envs_only"] = {k: v["median"] / row["envs_only"] for k, v in peers.items()}
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", nargs="+", default=["pong-like", "straggler"])
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--num-steps", type=int, default=64, help="rows per collect")
    ap.add_argument("--time-scale", type=float, default=4.0, help="multiplies every emulated wait")
    ap.add_argument("--sim-cores", type=int, default=16, help="the emulated simulator machine's cores")
    ap.add_argument("--context-seconds", type=float, default=2.5, help="the device's start cost per process")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--collects", type=int, default=2, help="collects per sample")
    ap.add_argument("--tune-seconds", type=float, default=0.0, help="also run auturi.tune for this long (0: no)")
    ap.add_argument("--tune-cores", type=int, default=None,
                    help="the cores auturi.tune plans for (default: --sim-cores, the emulated machine's; "
                         "0: this machine's)")
    ap.add_argument("--overlap", action="store_true",
                    help="also overlapped layouts (replicas, one env a worker, two actors) and their lockstep rivals")
    ap.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    ap.add_argument("--smoke", action="store_true", help="the smallest run, for the tests (numbers mean nothing)")
    ap.add_argument("--out", default=None, help="default bench/results/emulated_gpu[_quick].json")
    args = ap.parse_args(argv)
    if args.quick or args.smoke:
        args.num_steps, args.rounds, args.collects, args.context_seconds = 32, 2, 1, 0.5
    if args.smoke:
        args.quick, args.num_envs, args.num_steps, args.rounds, args.sim_cores = True, 4, 4, 1, 2
        args.time_scale, args.context_seconds, args.tune_seconds = 0.05, 0.01, 0.0
    if args.tune_cores is None:
        args.tune_cores = args.sim_cores
    out_path = args.out or f"bench/results/emulated_gpu{'_quick' if args.quick else ''}.json"

    from auturi.testing.emulated_gpu import emulated_gpu
    from auturi.testing.emulated_sim import SimCores

    import stable_baselines3  # noqa: F401  (versions in the header)

    out = {"machine": machine_header(), "command": "python -m bench.emulated_gpu " + " ".join(argv or sys.argv[1:]),
           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "settings": {k: v for k, v in vars(args).items() if k != "out"}, "profiles": []}
    print(out["machine"], flush=True)
    t0 = time.perf_counter()
    with emulated_gpu(), SimCores(args.sim_cores) as pool:
        for profile in args.profiles:
            out["profiles"].append(run_profile(profile, args, pool.name))
    out["seconds"] = time.perf_counter() - t0
    return save_and_print(out, out_path, markdown)


def markdown(out: dict) -> str:
    s = out["settings"]
    lines = [f"Machine: {out['machine']}  ",
             f"Command: `{out['command']}` ({out['started']}; {out['seconds']:.0f} s)  ",
             f"{s['num_envs']} envs x {s['num_steps']} steps per collect, time scale {s['time_scale']:g}, "
             f"{s['sim_cores']} emulated simulator cores, device start {s['context_seconds']:g} s per process", ""]
    for r in out["profiles"]:
        lines += [f"**{r['profile']}** ({r['description']}; mean step {r['mean_step_ms']:.2f} ms scaled): "
                  f"envs only {r['envs_only']:,.0f} steps/s (free-running, no policy), "
                  f"the emulated machine's model {r['ceiling_model']:,.0f}", "",
                  "| system | layout | loop | steps/s | spread | vs SB3 Subproc | vs envs only | start s |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
        for name, p in r["peers"].items():
            vs = r["vs_sb3_subproc"].get(name)
            loop = r.get("loops", {}).get(name, "-")
            lines.append(f"| {name} | {r['configs'].get(name, '-').replace('|', '/')} | {loop} | {p['median']:,.0f} | "
                         f"{p['spread']:.0%} | {f'{vs:.2f}x' if vs is not None else '-'} | "
                         f"{r['vs_envs_only'][name]:.0%} | {r['start_seconds'].get(name, 0):.1f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
