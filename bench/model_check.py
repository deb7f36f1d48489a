"""The tuner's model against measurements on a GPU machine (issue 33 item 2): predicted vs
measured steps/s for CUDA layouts, on

- ``real``: the GPU box's record (``../shared/data/gpu-2026-11-26/tune_pong64.json``: one
  H200, 16 cores, Pong 64 envs): ``predict()`` from the tuner's recorded profile for each
  measured config, (a) the profile alone, (b) fitted to the other measured configs than the
  one predicted's family (degree 16 held out) and (c) fitted to all of them, as the tuner's
  search refits after each measurement. Nothing is run;
- ``emulated``: the emulated GPU box on this machine (:func:`auturi.testing.emulated_box`,
  ``pong-like`` and ``straggler`` steps, 32 envs, time scale 4 as ``bench.emulated_gpu``):
  the tuner's own profiling (:func:`~auturi.tuner.profile.profile_executor`) then ten CUDA
  layouts (:func:`emulated_layouts`: five lockstep, five in the overlapped loop) measured in
  interleaved rounds, each against the profile-only prediction (what the model strategy
  ranks with before any measurement), with the loop it ran and its actors' blocked share;
- ``computing`` (``--computing [ENV_ID]``, default ALE/Pong-v5, 8 envs): envs that compute on
  this machine's own cores, the policy on an emulated device, profiled as ``auturi tune``
  profiles (:func:`computing`); about a minute on 2 cores;
- ``cpu_policy`` (``--cpu-policy [ENV_ID]``, default ALE/Pong-v5, 8 envs): the same envs with the
  Nature CNN on this machine's CPU, in one-actor and several-actor layouts (whose replicas
  run at fewer torch threads than the caller the profile timed in), each against the
  profile-only prediction (:func:`cpu_policy`).

Run: python -m bench.model_check [--skip-emulated] [--profiles pong-like straggler] [--rounds 3]
     [--computing [ENV_ID]] [--computing-envs 8] [--cpu-policy [ENV_ID]]
     [--out bench/results/model_check.json]
     python -m bench.model_check --recheck bench/results/model_check.json --out /tmp/recheck.json
A run of the emulated part takes about 2-3 minutes on 2 cores (10 layouts, two profiles;
2m13s on 2026-11-26 at load 3-6); ``--recheck`` runs nothing: it redoes the predictions of a
saved run with the model as it is now. The numbers are printed and saved; nothing is asserted
(the unit tests in ``tests/test_tuner_gpu_model.py`` check the model deterministically on the
record's figures and on this bench's measurements).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from bench.common import interleave, machine_header, save_and_print, summarize

RECORD = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gpu-2026-11-26", "tune_pong64.json")


def real_box(path: str) -> dict:
    """Predictions from the GPU box's recorded profile for every measured config.

    The record (project at be1db39) predates the executor's overlapped loop: its one layout
    that would run overlapped now (1 x 64, degree 32, 4 replicas of batch 8) ran in the
    general loop, so every row is predicted, and the fits made, as the loop it ran in; for
    the layouts that overlap now, ``overlapped_forecast`` is the current model's prediction
    in the overlapped loop (fitted to all), a forecast no measurement has checked yet."""
    from unittest import mock

    from auturi import Config
    from auturi.tuner import model
    from auturi.tuner.model import fit_overheads, predict
    from auturi.tuner.profile import Profile

    with open(path) as f:
        rec = json.load(f)
    prof = Profile.from_dict(rec["strategy"]["profile"])
    trials = [(Config.from_dict(t["config"]), float(t["median"]), t.get("predicted"))
              for t in rec["trials"] if t.get("status") == "ok" and t.get("median")]
    now_overlapped = {c for c, _, _ in trials if model.overlaps(c)}
    measured = [(c, m) for c, m, _ in trials]
    held = [(c, m) for c, m in measured if c.env_parallel_degree != 16]
    with mock.patch.object(model, "overlaps", lambda config: False):  # the loops the record ran
        fit_held, fit_all = fit_overheads(prof, held), fit_overheads(prof, measured)
        rows = [{"config": str(c), "measured": m, "recorded_prediction": p, "profile": predict(c, prof),
                 "held_out_fit": predict(c, fit_held), "held_out": c.env_parallel_degree == 16,
                 "all_fit": predict(c, fit_all)} for c, m, p in trials]
    for (c, _, _), row in zip(trials, rows):
        row["overlapped_forecast"] = predict(c, fit_all) if c in now_overlapped else None
    keys = ("loaded_step_factor", "device_share", "contention", "ipc_seconds", "actor_collect_seconds",
            "env_worker_collect_seconds", "replica_collect_seconds")
    return {"record": os.path.abspath(path), "rows": rows,
            "fitted_held_out": {k: getattr(fit_held, k) for k in keys},
            "fitted_all": {k: getattr(fit_all, k) for k in keys}}


def emulated_layouts(n: int) -> dict[str, Any]:
    """The CUDA layouts measured on the emulated box for ``n`` envs: lockstep ones (one batch
    of all the actor's envs) and overlapped ones (``ActorPlan.overlap``: several batches or
    replicas, env workers; those of ``bench.emulated_gpu --overlap``), named as its table."""
    from auturi import Config

    h, q = n // 2, n // 4
    return {f"1x{n}_d8": Config(1, n, 8, 1, "cuda", n), f"1x{n}_d16": Config(1, n, 16, 1, "cuda", n),
            f"2x{h}_d8": Config(2, h, 8, 1, "cuda", h), f"4x{q}_d4": Config(4, q, 4, 1, "cuda", q),
            f"2x{h}_d16": Config(2, h, 16, 1, "cuda", h),
            # overlapped: two batches in the actor, two or four replicas, two actors with two each
            f"1x{n}_d16_b{h}": Config(1, n, 16, 1, "cuda", h),
            f"1x{n}_d16_2rep_b{h}": Config(1, n, 16, 2, "cuda", h),
            f"1x{n}_d{n}_2rep_b{h}": Config(1, n, n, 2, "cuda", h),
            f"1x{n}_d{n}_4rep_b{q}": Config(1, n, n, 4, "cuda", q),
            f"2x{h}_d16_2rep_b{q}": Config(2, h, 16, 2, "cuda", q)}


def emulated(profile: str, num_envs: int, num_steps: int, time_scale: float, rounds: int, collects: int) -> dict:
    """Profile the emulated box as the tuner does, then measure the CUDA layouts of
    :func:`emulated_layouts`; each row keeps the actor loop it ran and the share of the
    collect its actors spent blocked (``wait_share``), and the profile is saved whole, so the
    model can be re-checked against these measurements without running them again."""
    import auturi
    from auturi import Config
    from auturi.testing.emulated_gpu import emulated_box
    from auturi.tuner.profile import predict, profile_executor
    from bench.emulated_gpu import loop_of
    from bench.peers import AuturiRunner

    n = num_envs
    layouts = emulated_layouts(n)
    waits: dict[str, list[float]] = {k: [] for k in layouts}

    def sample(name: str, r: Any) -> float:
        steps = seconds = wait = 0.0
        for _ in range(collects):
            st = r.ex.collect(num_steps).stats
            steps, seconds, wait = steps + st.steps, seconds + st.seconds, wait + st.wait_seconds
        waits[name].append(wait / (seconds * r.config.num_actors))
        return steps / seconds

    with emulated_box(profile, time_scale=time_scale, context_seconds=0.0) as box:
        with auturi.make_executor(box.env, box.policy(), num_envs=n, config=Config.serial(n, "cuda"),
                                  backend="shm") as ex:
            ex.collect(num_steps)  # the tuner profiles after measuring the start config
            prof = profile_executor(ex, devices=["cpu", "cuda"], num_steps=num_steps)
        runners: dict[str, Any] = {}
        try:
            for name, cfg in layouts.items():
                runners[name] = AuturiRunner(box.env, box.policy(), n, cfg, warmup_steps=num_steps)
            samples = interleave(runners, rounds, sample, progress=lambda s: print(f"{profile}: {s}", flush=True))
        finally:
            for r in runners.values():
                r.close()
    rows = []
    for name, cfg in layouts.items():
        m = summarize(samples[name])
        rows.append({"name": name, "config": str(cfg), "config_dict": cfg.to_dict(), "loop": loop_of(cfg),
                     "measured": m["median"], "samples": samples[name],
                     "wait_share": sorted(waits[name])[len(waits[name]) // 2], "predicted": predict(cfg, prof)})
    return {"profile": profile, "profiled": {"env_step_seconds": prof.env_step_seconds,
                                             "env_step_std": prof.env_step_std,
                                             "env_cpu_fraction": prof.env_cpu_fraction,
                                             "cuda": prof.policy_seconds.get("cuda")},
            "profile_dict": prof.to_dict(), "load": os.getloadavg(), "rows": rows}


def computing_layouts(n: int, cores: int) -> dict[str, Any]:
    """The CUDA layouts of the computing part for ``n`` envs on ``cores`` cores: lockstep ones
    with one, two and four env lanes a core (the GPU box's 1 x 64 at degree 32 has two a core),
    two actors, and overlapped ones with two replicas."""
    from auturi import Config

    def degree(k: int) -> int:
        return max(d for d in range(1, min(n, k) + 1) if n % d == 0)

    out: dict[str, Any] = {}
    for per_core in (1, 2, 4):
        d = degree(per_core * cores)
        out.setdefault(f"1x{n}_d{d}", Config(1, n, d, 1, "cuda", n))
    h = n // 2
    if n % 2 == 0:
        dh = max(d for d in range(1, min(h, cores) + 1) if h % d == 0)
        out[f"2x{h}_d{dh}"] = Config(2, h, dh, 1, "cuda", h)
        for per_core in (2, 4):
            d = degree(per_core * cores)
            out.setdefault(f"1x{n}_d{d}_2rep_b{h}", Config(1, n, d, 2, "cuda", h))
    return out


def _computing_env(env_id: str) -> tuple[Any, Any, tuple[int, ...]]:
    """``env_id``'s env factory as ``auturi tune`` makes it (an ALE id with the Atari
    preprocessing), its action space and its observation shape (one env made and closed)."""
    from auturi.envs import find_env_id, resolve_env_fns
    from auturi.envs.atari import AtariPreprocessed, is_ale_id

    full_id, _ = find_env_id(env_id)  # imports ale_py for ALE ids
    env = AtariPreprocessed(full_id) if is_ale_id(full_id) else resolve_env_fns(env_id, 1)[0]
    probe = env()
    try:
        return env, probe.action_space, tuple(probe.observation_space.shape)
    finally:
        probe.close()


def _measure_layouts(env: Any, policy: Any, n: int, layouts: dict[str, Any], num_steps: int, rounds: int,
                     collects: int, label: str, first: dict[str, Any] | None = None) -> dict[str, list[float]]:
    """Samples (steps/s) of each layout (an Auturi ``shm`` executor with ``policy()``) and of
    the runners ``first`` makes, in ``rounds`` interleaved rounds of ``collects`` collects;
    every runner is closed after, on every path."""
    from bench.peers import AuturiRunner

    runners: dict[str, Any] = {}
    try:
        for name, make in (first or {}).items():
            runners[name] = make()
        for name, cfg in layouts.items():
            runners[name] = AuturiRunner(env, policy(), n, cfg, warmup_steps=num_steps)
        return interleave(runners, rounds, lambda _n, r: sum(r.run(num_steps) for _ in range(collects)) / collects,
                          progress=lambda s: print(f"{label}: {s}", flush=True))
    finally:
        for r in runners.values():
            r.close()


def computing(env_id: str, num_envs: int, num_steps: int, rounds: int, collects: int) -> dict:
    """The regime of the GPU box's record where the envs compute: ``env_id`` made as
    ``auturi tune`` makes it (an ALE id with the Atari preprocessing) stepping on this
    machine's own cores, with the policy on an emulated device (its passes wait and hold no
    core, as a CUDA pass waited on with :func:`auturi.device_wait.to_host`). The emulated box
    above has envs that wait instead, so its cores never saturate; here they do, as on the GPU
    box, where the model read 1.7-2.7x high. The tuner's own profile, then the envs alone
    (one process per core, a fixed action: ``envs_only``) and :func:`computing_layouts`
    measured in interleaved rounds against the profile-only prediction."""
    import auturi
    from auturi import Config
    from auturi.resources import usable_cores
    from auturi.testing.emulated_gpu import EmulatedDevicePolicy, emulated_gpu
    from auturi.tuner.profile import predict, profile_executor
    from bench.emulated_gpu import FreeEnvs, loop_of

    n, cores = num_envs, usable_cores()
    env, space, _ = _computing_env(env_id)
    num_actions = int(space.n)

    def policy() -> EmulatedDevicePolicy:
        p = EmulatedDevicePolicy(num_actions, context_seconds=0.0)
        p.to("cuda")
        return p

    layouts = computing_layouts(n, cores)
    with emulated_gpu():
        with auturi.make_executor(env, policy(), num_envs=n, config=Config.serial(n, "cuda"), backend="shm") as ex:
            ex.collect(num_steps)
            # as ``auturi tune`` profiles: the env also stepped on every core at once
            prof = profile_executor(ex, devices=["cuda"], num_steps=num_steps, loaded=True)
        procs = max(d for d in range(1, min(n, cores) + 1) if n % d == 0)
        samples = _measure_layouts(env, policy, n, layouts, num_steps, rounds, collects, "computing",
                                   first={"envs_only": lambda: FreeEnvs(env, n, procs)})
    ceiling = summarize(samples["envs_only"])["median"]
    rows = []
    for name, cfg in layouts.items():
        m = summarize(samples[name])
        rows.append({"name": name, "config": str(cfg), "config_dict": cfg.to_dict(), "loop": loop_of(cfg),
                     "measured": m["median"], "samples": samples[name], "of_envs_only": m["median"] / ceiling,
                     "predicted": predict(cfg, prof)})
    return {"env": env_id, "num_envs": n, "cores": cores, "envs_only": ceiling, "envs_only_samples": samples["envs_only"],
            "profiled": {"env_step_seconds": prof.env_step_seconds, "env_step_std": prof.env_step_std,
                         "env_cpu_fraction": prof.env_cpu_fraction, "cuda": prof.policy_seconds.get("cuda")},
            "profile_dict": prof.to_dict(), "load": os.getloadavg(), "rows": rows}


def cpu_policy(env_id: str, num_envs: int, num_steps: int, rounds: int, collects: int) -> dict:
    """``env_id``'s envs (an ALE id with the Atari preprocessing) with the Nature CNN on the
    CPU: the tuner's own profile (a serial executor, ``profile_executor``), then one-actor and
    several-actor layouts measured in interleaved rounds, each against the profile-only
    prediction. The profile times the policy at the caller's best thread count; a several-actor
    layout's replicas run at the cores left over, shared (``policy_threads``)."""
    import auturi
    from auturi import Config
    from auturi.nets import NatureCNNActorCritic
    from auturi.policy import TorchPolicy
    from auturi.resources import usable_cores
    from auturi.tuner.profile import predict, profile_executor

    n, cores = num_envs, usable_cores()
    env, space, obs_shape = _computing_env(env_id)
    channels = obs_shape[0]

    def policy() -> Any:
        return TorchPolicy(lambda: NatureCNNActorCritic(channels, int(space.n)), space)

    with auturi.make_executor(env, policy(), num_envs=n, config=Config.serial(n), backend="shm") as ex:
        ex.collect(num_steps)
        prof = profile_executor(ex, devices=["cpu"], num_steps=num_steps)
    shapes = [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (n, 1)]
    layouts = {f"{a}x{n // a}_d{d}": Config(a, n // a, d, 1, "cpu", n // a) for a, d in shapes
               if n % a == 0 and (n // a) % d == 0}
    samples = _measure_layouts(env, policy, n, layouts, num_steps, rounds, collects, "cpu policy")
    rows = [{"name": name, "config": str(cfg), "config_dict": cfg.to_dict(), "measured": summarize(samples[name])["median"],
             "samples": samples[name], "predicted": predict(cfg, prof)}
            for name, cfg in layouts.items()]
    return {"env": env_id, "num_envs": n, "cores": cores, "profile_dict": prof.to_dict(), "load": os.getloadavg(),
            "rows": rows}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", default=RECORD)
    ap.add_argument("--skip-emulated", action="store_true")
    ap.add_argument("--profiles", nargs="+", default=["pong-like", "straggler"])
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--num-steps", type=int, default=64)
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--collects", type=int, default=2, help="collects per sample")
    ap.add_argument("--computing", metavar="ENV_ID", nargs="?", const="ALE/Pong-v5", default=None,
                    help="also the computing part: ENV_ID's envs (default ALE/Pong-v5) on this machine's cores")
    ap.add_argument("--computing-envs", type=int, default=8)
    ap.add_argument("--cpu-policy", metavar="ENV_ID", nargs="?", const="ALE/Pong-v5", default=None,
                    help="also the CPU-policy part: ENV_ID's envs with the Nature CNN on the CPU")
    ap.add_argument("--out", default="bench/results/model_check.json")
    ap.add_argument("--recheck", metavar="JSON", help="run nothing: predict the emulated rows of an earlier "
                    "run's record (its saved profiles and configs) with the model as it is now, and the real record")
    args = ap.parse_args(argv)
    if args.recheck:
        return save_and_print(recheck(args.recheck, args.record), args.out, markdown)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"machine": machine_header(),
                           "command": "python -m bench.model_check " + " ".join(argv or sys.argv[1:]),
                           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if os.path.exists(args.record):
        out["real"] = real_box(args.record)
    else:
        print(f"real box: skipped ({args.record} not found)")
    if not args.skip_emulated:
        out["emulated"] = [emulated(p, args.num_envs, args.num_steps, args.time_scale, args.rounds, args.collects)
                           for p in args.profiles]
    if args.computing:
        out["computing"] = computing(args.computing, args.computing_envs, args.num_steps, args.rounds, args.collects)
    if args.cpu_policy:
        out["cpu_policy"] = cpu_policy(args.cpu_policy, args.computing_envs, args.num_steps, args.rounds, args.collects)
    out["seconds"] = time.perf_counter() - t0
    return save_and_print(out, args.out, markdown)


def recheck(path: str, record: str) -> dict:
    """An earlier run's record with every prediction redone by the current model: its
    emulated rows against their saved profile (runs without ``profile_dict`` are left as they
    were), and the real box's record afresh."""
    from auturi import Config
    from auturi.tuner.profile import Profile, predict

    with open(path) as f:
        out = json.load(f)
    for e in out.get("emulated") or []:
        if "profile_dict" not in e:
            continue
        prof = Profile.from_dict(e["profile_dict"])
        for r in e["rows"]:
            r["predicted"] = predict(Config.from_dict(r["config_dict"]), prof)
    c = out.get("computing")
    if c:
        prof = Profile.from_dict(c["profile_dict"])
        for r in c["rows"]:
            r["predicted"] = predict(Config.from_dict(r["config_dict"]), prof)
    if os.path.exists(record):
        out["real"] = real_box(record)
    out["rechecked"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return out


def _err(p: float, m: float) -> str:
    return f"{p:,.0f} ({p / m - 1:+.0%})"


def markdown(out: dict) -> str:
    lines = [f"Machine: {out['machine']}  ", f"Command: `{out['command']}` ({out['started']})"
             + (f", predictions redone {out['rechecked']}" if out.get("rechecked") else ""), ""]
    real = out.get("real")
    if real:
        lines += [f"Real GPU box (record {os.path.basename(real['record'])}): predicted steps/s (error vs measured)", "",
                  "| config | measured | predicted then | profile alone | fitted, degree 16 held out | fitted to all |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in real["rows"]:
            then = f"{r['recorded_prediction']:,.0f}" if r["recorded_prediction"] else "-"
            held = ("**" + _err(r["held_out_fit"], r["measured"]) + "** (held out)") if r["held_out"] else \
                _err(r["held_out_fit"], r["measured"])
            lines.append(f"| {r['config'].replace('|', '/')} | {r['measured']:,.0f} | {then} | "
                         f"{_err(r['profile'], r['measured'])} | {held} | {_err(r['all_fit'], r['measured'])} |")
        fa = real["fitted_all"]
        lines += ["", "fitted to all: " + ", ".join(f"{k} {v:.3g}" for k, v in fa.items()),
                  "fitted, held out: " + ", ".join(f"{k} {v:.3g}" for k, v in real["fitted_held_out"].items())]
        for r in real["rows"]:
            if r.get("overlapped_forecast"):
                lines.append(f"{r['config'].replace('|', '/')} ran in the general loop (the record predates the "
                             f"overlapped loop); in the overlapped loop the model forecasts "
                             f"{r['overlapped_forecast']:,.0f} steps/s (fitted to all; unmeasured)")
        lines.append("")
    for e in out.get("emulated") or []:
        load = " (load average {:.1f} / {:.1f} / {:.1f} at its end)".format(*e["load"]) if e.get("load") else ""
        lines += [f"Emulated GPU box, {e['profile']} (profiled step {e['profiled']['env_step_seconds'] * 1e3:.2f} ms, "
                  f"std {e['profiled']['env_step_std'] * 1e3:.2f} ms): profile-only prediction vs measured{load}", "",
                  "| layout | loop | measured | actors blocked | predicted (error) |", "|---|---|---:|---:|---:|"]
        for r in e["rows"]:
            blocked = f"{r['wait_share']:.0%}" if "wait_share" in r else "-"
            lines.append(f"| {r['config'].replace('|', '/')} | {r.get('loop', '-')} | {r['measured']:,.0f} | "
                         f"{blocked} | {_err(r['predicted'], r['measured'])} |")
        lines.append("")
    c = out.get("computing")
    if c:
        load = " (load average {:.1f} / {:.1f} / {:.1f} at its end)".format(*c["load"])
        lines += [f"Computing envs, {c['env']} x {c['num_envs']} on {c['cores']} cores, policy on an emulated device "
                  f"(profiled step {c['profiled']['env_step_seconds'] * 1e3:.2f} ms; envs alone "
                  f"{c['envs_only']:,.0f} steps/s): profile-only prediction vs measured{load}", "",
                  "| layout | loop | measured | of envs alone | predicted (error) |", "|---|---|---:|---:|---:|"]
        for r in c["rows"]:
            lines.append(f"| {r['config'].replace('|', '/')} | {r['loop']} | {r['measured']:,.0f} | "
                         f"{r['of_envs_only']:.0%} | {_err(r['predicted'], r['measured'])} |")
        lines.append("")
    c = out.get("cpu_policy")
    if c:
        load = " (load average {:.1f} / {:.1f} / {:.1f} at its end)".format(*c["load"])
        lines += [f"CPU policy, {c['env']} x {c['num_envs']} on {c['cores']} cores, Nature CNN on the CPU: "
                  f"profile-only prediction vs measured{load}", "",
                  "| layout | measured | predicted (error) |", "|---|---:|---:|"]
        for r in c["rows"]:
            lines.append(f"| {r['config'].replace('|', '/')} | {r['measured']:,.0f} | "
                         f"{_err(r['predicted'], r['measured'])} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
