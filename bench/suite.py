"""The benchmark suite: Auturi against every peer, side by side, in one run (issue 7).

Sections (``--sections``, all by default):

collect   for each workload of :mod:`bench.workloads`: Auturi tuned (the default ``model``
          strategy, its choice re-measured on a fresh executor), Auturi's best fixed config
          (the grid's best from ``bench/results/tune_quality.json``), SB3 DummyVecEnv and
          SubprocVecEnv, gymnasium AsyncVectorEnv, EnvPool (sync and async) where EnvPool has
          the env, PufferLib's multiprocessing vector env (sync and async) where installed, RLlib EnvRunners (0 and 2 remote runners) where ray[rllib] is installed,
          TorchRL's collectors (:mod:`bench.torchrl_peer`) where torchrl is installed; all
          with the workload's own policy network, interleaved within each round. The serial
          config runs in the same rounds (:class:`bench.peers.LimitProbe`, not a peer) for this
          machine's limit for the workload, as ``auturi tune`` estimates it; the tuned choice's
          median is reported as a fraction of it.
e2e       wall seconds of PPO ``learn`` for a fixed number of steps: SB3's default against
          ``auturi.wrap(model)`` (online tuning inside the run) and
          ``auturi.wrap(model, config=<the collect section's tuned choice>)``.
envstep   env-parallel scaling, N = 1..64 CartPoles with constant actions (:mod:`bench.envstep`).
actors    actor scaling on the ``slow`` workload, 4 envs per actor: Auturi ``num_actors`` = 1..k
          against RLlib ``num_env_runners`` = 1..k.

Outputs: ``<out>/<name>.json`` (every sample), ``<out>/<name>.md`` (the tables) and the PNG
plots, in a folder of their own: ``--out DIR``, by default ``bench/results/runs/<date>-<time>/``.
Nothing tracked changes unless asked: with ``--update-docs`` the JSON and markdown go to
``bench/results/`` (the records the page cites; ``--out`` still wins), the PNGs to ``docs/img/``
and the tables are spliced into ``docs/benchmarks.md`` between ``<!-- bench:begin -->`` and
``<!-- bench:end -->`` (the README's ``python -m bench --quick`` rewrote the tracked page and
its plots, 2026-11-26).

Run: python -m bench [--quick] [--workloads cartpole slow] [--rounds 5] [--out DIR] [--update-docs]
(also ``auturi bench ...`` from a source checkout).

Over 400 lines because the four sections' drivers share :class:`Sizing`, :class:`Progress` and
the Ray shutdown order in :func:`main`; the next section added should split the drivers into
one module per section.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import interleave, machine_header, summarize

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ("collect", "e2e", "envstep", "actors")
# Gymnasium ids of the workloads' envs, for SB3's make_vec_env in the end-to-end section.
E2E_ENV_IDS = {"cartpole": "CartPole-v1", "slow": "auturi/Slow-v0", "heavytail": "auturi/HeavyTail-v0"}


@dataclasses.dataclass
class Sizing:
    """How much of everything one run does."""

    workloads: list[str]
    rounds: int
    tune_seconds: float
    """The ``model`` strategy's search budget (wall seconds, profiling included)."""
    max_trial_seconds: float
    rllib_runners: list[int]
    """``num_env_runners`` settings of the RLlib peer in the collect section."""
    e2e: list[tuple[str, int, int]]
    """(workload, learn steps, repeats)."""
    envstep_ns: list[int]
    envstep_steps: int
    envstep_rounds: int
    actors: list[int]
    envs_per_actor: int = 4
    rows: int | None = None
    """Rows per collection sample (default: the workload's rollout length)."""
    num_envs: int | None = None
    """Envs per workload (default: the workload's)."""
    collects_per_sample: int = 1
    """One sample = this many back-to-back collects (steps over their summed time): longer,
    steadier samples without changing the rollout length."""
    e2e_kinds: tuple[str, ...] = ("sb3", "tuned", "fixed")
    torchrl: tuple[str, ...] = ("torchrl_sync", "torchrl_multisync", "torchrl_async_batched")
    """TorchRL collectors in the collect section (:data:`bench.torchrl_peer.KINDS`)."""


def sizing(mode: str) -> Sizing:
    """The presets: ``full`` (~45 min on 2 cores), ``quick`` (~4 min), ``smoke`` (the CI test)."""
    from bench.workloads import WORKLOADS

    if mode == "smoke":
        # Shapes, not numbers: 3 envs make TorchRL's layout one worker process (a spawned
        # interpreter importing torch, seconds each) instead of 2; N = 2 alone runs every
        # envstep runner (the degree-2 one included), as N = 1 and 2 did (2026-11-26).
        return Sizing(workloads=["cartpole"], rounds=2, tune_seconds=1.0, max_trial_seconds=0.5, rllib_runners=[0],
                      e2e=[("cartpole", 512, 1)], envstep_ns=[2], envstep_steps=200, envstep_rounds=1,
                      actors=[], rows=32, num_envs=3, e2e_kinds=("sb3", "fixed"), torchrl=("torchrl_multisync",))
    if mode == "quick":
        return Sizing(workloads=["cartpole"], rounds=3, tune_seconds=8.0, max_trial_seconds=2.0, rllib_runners=[0, 2],
                      e2e=[("slow", 4096, 1)], envstep_ns=[1, 4, 16], envstep_steps=1000, envstep_rounds=2,
                      actors=[1, 2], collects_per_sample=2)
    return Sizing(workloads=list(WORKLOADS), rounds=5, tune_seconds=20.0, max_trial_seconds=4.0, rllib_runners=[0, 2],
                  e2e=[("cartpole", 30000, 2), ("slow", 8192, 2)], envstep_ns=[1, 2, 4, 8, 16, 32, 64],
                  envstep_steps=10000, envstep_rounds=5, actors=[1, 2, 4], collects_per_sample=3)


def sample(runner: Any, rows: int, collects: int) -> float:
    """Env steps/s over ``collects`` back-to-back ``runner.run(rows)`` calls (each returns
    steps/s of equal step counts, so the total rate is their harmonic mean)."""
    return collects / sum(1.0 / runner.run(rows) for _ in range(collects))


class Progress:
    """Progress lines on stdout: elapsed seconds, section, what runs."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, where: str, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.0f}s] {where}: {msg}", flush=True)

    def at(self, where: str):
        return lambda msg: self(where, msg)


# ---------------------------------------------------------------------------- collect
def tune_choice(workload: Any, s: Sizing) -> dict:
    """Tune ``workload`` with the default ``model`` strategy on a fresh shm executor."""
    from bench.tune_quality import tune

    result, secs = tune(workload, "model", budget_seconds=s.tune_seconds, max_trial_seconds=s.max_trial_seconds,
                        max_samples=6)
    profile = (result.strategy or {}).get("profile")
    return {"choice": result.choice.to_dict(), "label": str(result.choice), "seconds": secs,
            "trials": len(result.trials), "tuned_throughput": result.throughput, "reason": result.reason,
            # what the limit reads from the profile, as the CLI's: inference's wall and CPU time
            # by batch size, and the share of an env step that computes rather than waits
            "inference_profile": ({k: profile.get(k) for k in ("policy_seconds", "policy_cpu_seconds",
                                                               "env_cpu_fraction")}
                                  if isinstance(profile, dict) else None)}


def fixed_config(workload: Any, path: Path = REPO / "bench/results/tune_quality.json") -> tuple[Any, str] | None:
    """Auturi's best fixed config for ``workload``: the ``grid`` strategy's choice (every
    config measured) from a ``bench.tune_quality`` run, when one covers this workload."""
    from auturi import Config

    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for row in rec.get("workloads", []):
        if row.get("workload") == workload.name and row.get("num_envs") == workload.num_envs and "grid" in row:
            return (Config.from_dict(row["grid"]["choice"]),
                    f"grid best of {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
                    f"({rec.get('machine', '?').split(';')[0]})")
    return None


def sized(workload: Any, s: Sizing) -> Any:
    """``workload`` with the sizing's envs and rows, where it overrides them."""
    return dataclasses.replace(workload, num_envs=s.num_envs or workload.num_envs,
                               num_steps=s.rows or workload.num_steps)


LIMIT = "_limit"  # the limit probe's name among the runners (not a peer; its samples are dropped)


def collect_workload(workload: Any, s: Sizing, ray_cpus: int, progress: Any) -> dict:
    from auturi import Config
    from bench.peers import AuturiRunner, LimitProbe, make_workload_peer, peer_unavailable

    workload = sized(workload, s)
    where = f"collect {workload.name}"
    row: dict[str, Any] = {"workload": workload.name, "description": workload.description,
                           "env_id": workload.env_id, "num_envs": workload.num_envs, "rows": workload.num_steps,
                           "peers": {}, "settings": {}, "skipped": {}}
    progress(where, f"tuning (model strategy, {s.tune_seconds:g} s budget)")
    row["tuned"] = tune_choice(workload, s)
    progress(where, f"tuned in {row['tuned']['seconds']:.0f} s -> {row['tuned']['label']}")
    fixed = fixed_config(workload)
    if fixed is None:
        row["skipped"]["auturi_fixed"] = ("no grid result for this workload in bench/results/tune_quality.json "
                                          f"(run python -m bench.tune_quality --workloads {workload.name})")
    else:
        row["fixed"] = {"choice": fixed[0].to_dict(), "label": str(fixed[0]), "source": fixed[1]}
    makers: dict[str, Any] = {
        "auturi_tuned": lambda: AuturiRunner(workload.make_env(), workload.make_policy(), workload.num_envs,
                                             Config.from_dict(row["tuned"]["choice"]), warmup_steps=workload.num_steps),
    }
    row["settings"]["auturi_tuned"] = row["tuned"]["label"]
    if fixed is not None:
        makers["auturi_fixed"] = lambda: AuturiRunner(workload.make_env(), workload.make_policy(), workload.num_envs,
                                                      fixed[0], warmup_steps=workload.num_steps)
        row["settings"]["auturi_fixed"] = row["fixed"]["label"]
    for kind in ("dummy", "subproc", "async", "envpool", "envpool_async", "pufferlib", "pufferlib_async"):
        why = peer_unavailable(kind, workload)
        if why:
            row["skipped"][kind] = why
            continue
        makers[kind] = (lambda k=kind: make_workload_peer(k, workload, warmup_steps=max(1, workload.num_steps // 4)))
    for kind in s.torchrl:
        why = peer_unavailable(kind, workload)
        if why:
            row["skipped"][kind] = why
            continue
        makers[kind] = (lambda k=kind: make_workload_peer(k, workload, warmup_steps=workload.num_steps))
    for r in s.rllib_runners:
        name = f"rllib_{r}"
        why = peer_unavailable("rllib", workload)
        if why:
            row["skipped"][name] = why
            continue
        makers[name] = (lambda r=r: make_workload_peer("rllib", workload, num_env_runners=r, ray_cpus=ray_cpus,
                                                        warmup_steps=max(1, workload.num_steps // 4)))
    runners: dict[str, Any] = {}
    try:
        for name, make in makers.items():
            progress(where, f"starting {name}")
            try:
                runners[name] = make()
            except Exception as e:  # noqa: BLE001 - a peer that cannot run this workload is reported, not fatal
                row["skipped"][name] = f"failed to start: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                progress(where, f"{name} skipped ({row['skipped'][name]})")
        for name, r in runners.items():
            settings = getattr(r, "settings", None)
            if settings is not None:
                row["settings"][name] = settings
        progress(where, "starting the limit probe (serial config)")
        runners[LIMIT] = LimitProbe(workload.make_env(), workload.make_policy(), workload.num_envs,
                                    warmup_steps=workload.num_steps)
        samples = interleave(runners, s.rounds, lambda name, r: sample(r, workload.num_steps, s.collects_per_sample),
                             lambda msg: progress(where, msg))
        del samples[LIMIT]
        row["limit"] = runners[LIMIT].limit(profile=row["tuned"].get("inference_profile"))
    finally:
        for r in runners.values():
            r.close()
    row["peers"] = {k: summarize(xs) for k, xs in samples.items()}
    if row["limit"].get("steps_per_second"):
        row["limit_share"] = row["peers"]["auturi_tuned"]["median"] / row["limit"]["steps_per_second"]
    auturi = row["peers"]["auturi_tuned"]["median"]
    row["auturi_vs"] = {k: auturi / v["median"] for k, v in row["peers"].items() if k != "auturi_tuned"}
    others = {k: v["median"] for k, v in row["peers"].items() if not k.startswith("auturi")}
    if others:
        best = max(others, key=others.get)
        row["best_peer"] = {"name": best, "median": others[best], "auturi_tuned_vs": auturi / others[best]}
    progress(where, "medians " + ", ".join(f"{k} {v['median']:,.0f}" for k, v in row["peers"].items()))
    return row


def run_collect(s: Sizing, ray_cpus: int, progress: Progress) -> dict:
    from bench.workloads import WorkloadUnavailable, get_workload

    out: dict[str, Any] = {"workloads": [], "skipped": {}}
    for name in s.workloads:
        w = get_workload(name)
        try:
            w.check()
        except WorkloadUnavailable as e:
            out["skipped"][name] = str(e)
            progress(f"collect {name}", f"skipped: {e}")
            continue
        out["workloads"].append(collect_workload(w, s, ray_cpus, progress))
    return out


# ---------------------------------------------------------------------------- e2e
def run_e2e(s: Sizing, collect: dict | None, progress: Progress) -> dict:
    import torch

    from bench.e2e_sb3 import run
    from bench.workloads import get_workload

    threads = torch.get_num_threads()
    tuned = {r["workload"]: r["tuned"] for r in (collect or {}).get("workloads", [])}
    out: dict[str, Any] = {"cases": [], "skipped": {}}
    try:
        for name, steps, repeats in s.e2e:
            where = f"e2e {name}"
            if name not in E2E_ENV_IDS:
                out["skipped"][name] = "no gymnasium id for SB3's make_vec_env"
                continue
            w = sized(get_workload(name), s)
            case: dict[str, Any] = {"workload": name, "env_id": E2E_ENV_IDS[name], "n_envs": w.num_envs,
                                    "n_steps": w.num_steps, "steps": steps, "repeats": repeats, "runs": []}
            if "fixed" in s.e2e_kinds:
                if name in tuned:
                    case["fixed_config"] = dict(tuned[name], source="the collect section's tuned choice")
                else:
                    progress(where, "tuning the fixed config (model strategy)")
                    case["fixed_config"] = dict(tune_choice(w, s), source="tuned here (model strategy)")
            cfg_json = json.dumps(case["fixed_config"]["choice"]) if "fixed_config" in case else None
            for rep in range(repeats):
                for kind in s.e2e_kinds:  # alternated: noise hits each alike
                    progress(where, f"repeat {rep + 1}/{repeats} {kind}: PPO learn {steps} steps")
                    r = run(kind, E2E_ENV_IDS[name], w.num_envs, steps, seed=rep, config_json=cfg_json,
                            n_steps=w.num_steps)
                    case["runs"].append(r)
                    progress(where, f"{kind} {r['seconds']:.1f} s, return {r['return']:.1f}, {r['layout']}")
            for kind in s.e2e_kinds:
                xs = [r for r in case["runs"] if r["kind"] == kind]
                case[kind] = dict(summarize([r["seconds"] for r in xs]),
                                  mean_return=sum(r["return"] for r in xs) / len(xs), layouts=[r["layout"] for r in xs])
            for kind in s.e2e_kinds[1:]:
                case[kind]["speedup_vs_sb3"] = case["sb3"]["median"] / case[kind]["median"]
            out["cases"].append(case)
    finally:
        torch.set_num_threads(threads)  # e2e_sb3.run pins torch to 1 thread
    return out


# ---------------------------------------------------------------------------- scaling
def run_envstep(s: Sizing, progress: Progress) -> dict:
    from bench.envstep import measure

    return {"env": "CartPole-v1", "policy": "ConstantPolicy", "steps_per_sample": s.envstep_steps,
            "rounds": s.envstep_rounds,
            "rows": measure(s.envstep_ns, s.envstep_steps, s.envstep_rounds, progress=progress.at("envstep"))}


def run_actors(s: Sizing, ray_cpus: int, progress: Progress) -> dict:
    from auturi import Config
    from bench.peers import AuturiRunner, make_workload_peer, peer_unavailable
    from bench.workloads import get_workload

    base = get_workload("slow")
    out: dict[str, Any] = {"workload": base.name, "envs_per_actor": s.envs_per_actor, "rows": [], "skipped": {}}
    why = peer_unavailable("rllib", base)
    if why:
        out["skipped"]["rllib"] = why
    for a in s.actors:
        where = f"actors {a}"
        w = dataclasses.replace(base, num_envs=a * s.envs_per_actor, num_steps=s.rows or base.num_steps)
        if a == s.actors[0]:
            out["rows_per_sample"] = w.num_steps
        cfg = Config(num_actors=a, envs_per_actor=s.envs_per_actor)
        makers = {"auturi": lambda: AuturiRunner(w.make_env(), w.make_policy(), w.num_envs, cfg,
                                                 warmup_steps=w.num_steps)}
        if not why:
            makers["rllib"] = lambda: make_workload_peer("rllib", w, num_env_runners=a, ray_cpus=ray_cpus,
                                                         warmup_steps=max(1, w.num_steps // 4))
        runners: dict[str, Any] = {}
        try:
            for k, make in makers.items():
                progress(where, f"starting {k}")
                runners[k] = make()
            samples = interleave(runners, s.rounds, lambda k, r: sample(r, w.num_steps, s.collects_per_sample),
                                 progress.at(where))
        finally:
            for r in runners.values():
                r.close()
        row: dict[str, Any] = {"actors": a, "num_envs": w.num_envs, "auturi_config": str(cfg)}
        row.update({k: summarize(xs) for k, xs in samples.items()})
        if "rllib" in row:
            row["auturi_vs_rllib"] = row["auturi"]["median"] / row["rllib"]["median"]
        out["rows"].append(row)
    return out


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 epilog="A full run (no --quick) takes about 45 minutes on 2 cores; --quick about 4.")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="one workload, few rounds, short budgets (~4 min on 2 cores)")
    size.add_argument("--smoke", action="store_true", help="the CI smoke test's sizing (~20 s): do not quote its numbers")
    ap.add_argument("--workloads", nargs="+", help="workloads of bench/workloads.py (default: all; --quick: cartpole)")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to run")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per measurement (default 5; --quick 3)")
    ap.add_argument("--tune-seconds", type=float, help="the model strategy's search budget per workload")
    ap.add_argument("--out", type=Path, help="folder of the JSON, the markdown and the plots (default: a new "
                                             "bench/results/runs/<date>-<time>/; with --update-docs: bench/results/)")
    ap.add_argument("--name", help="file stem of the outputs (default: bench, bench_quick or bench_smoke)")
    docs = ap.add_mutually_exclusive_group()
    docs.add_argument("--update-docs", action="store_true",
                      help="also update the docs: splice the tables into --docs, the plots into docs/img/")
    docs.add_argument("--no-docs", action="store_true",
                      help="leave docs/ alone (the default; kept for older command lines)")
    ap.add_argument("--docs", type=Path, default=REPO / "docs/benchmarks.md",
                    help="the page --update-docs splices the tables into")
    ap.add_argument("--note", default="", help="a sentence printed under the generated heading (e.g. how busy the "
                                               "machine was)")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be >= 1")
    return args


def outputs(args: argparse.Namespace, stamp: str | None = None) -> tuple[Path, Path | None]:
    """Where a run writes: (the folder of its JSON, markdown and plots, the docs page to
    splice or ``None``). Only ``--update-docs`` touches tracked files.

    >>> out, page = outputs(parse_args(["--quick"]), stamp="2026-11-26-120000")
    >>> out.relative_to(REPO).as_posix(), page
    ('bench/results/runs/2026-11-26-120000', None)
    >>> out, page = outputs(parse_args(["--update-docs"]))
    >>> out.relative_to(REPO).as_posix(), page.relative_to(REPO).as_posix()
    ('bench/results', 'docs/benchmarks.md')
    """
    if args.update_docs:
        return (args.out or REPO / "bench/results"), args.docs
    return (args.out or REPO / "bench/results/runs" / (stamp or time.strftime("%Y-%m-%d-%H%M%S"))), None


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it is inside it."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def command_line(argv: list[str]) -> str:
    """The command as typed, with a ``--note`` text (shown apart) elided.

    >>> command_line(["--quick", "--note", "a long sentence"])
    'python -m bench --quick --note <note>'
    """
    shown = list(argv)
    for i, a in enumerate(shown):
        if a == "--note" and i + 1 < len(shown):
            shown[i + 1] = "<note>"
        elif a.startswith("--note="):
            shown[i] = "--note=<note>"
    return "python -m bench" + ("" if not shown else " " + " ".join(
        x if x in ("<note>", "--note=<note>") else shlex.quote(x) for x in shown))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    s = sizing(mode)
    if args.workloads:
        from bench.workloads import get_workload

        for n in args.workloads:
            get_workload(n)  # ValueError lists the names
        s.workloads = list(args.workloads)
    if args.rounds:
        s.rounds = args.rounds
    if args.tune_seconds:
        s.tune_seconds = args.tune_seconds
    name = args.name or {"full": "bench", "quick": "bench_quick", "smoke": "bench_smoke"}[mode]
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=".*precision lowered.*")  # EnvPool's float64 Box bounds
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.getLogger("ray").setLevel(logging.ERROR)
    # The tuners must not start from (nor write into) the user's results cache.
    os.environ["AUTURI_CACHE_DIR"] = tempfile.mkdtemp(prefix="auturi-bench-cache-")

    import stable_baselines3  # noqa: F401  (versions in the header)
    import torch

    for optional in ("ray", "torchrl", "tensordict", "pufferlib"):  # versions in the header, when installed
        try:
            __import__(optional)
        except ImportError:
            pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ray_cpus = max([cores, 2] + s.rllib_runners + s.actors)
    progress = Progress()
    res: dict[str, Any] = {
        "name": name, "mode": mode, "machine": machine_header(),
        "command": command_line(argv),
        "note": args.note, "started": time.strftime("%Y-%m-%d %H:%M %Z"), "load_average_start": os.getloadavg(),
        "torch_threads": torch.get_num_threads(), "sizing": dataclasses.asdict(s), "sections": args.sections,
    }
    print(res["machine"], flush=True)
    print(f"{mode} run, sections {' '.join(args.sections)}, workloads {' '.join(s.workloads)}, {s.rounds} rounds",
          flush=True)
    # Order: what Ray takes part in runs between the rest, and Ray is shut down after it: its
    # daemons (raylet, GCS, idle workers) kept waking up and made the env-stepping rows and
    # the PPO runs measured after them noisier (degree 2 at N = 64 ranged 0.45x-1.5x
    # DummyVecEnv within one suite run, 1.9-2.2x in standalone runs).
    try:
        if "envstep" in args.sections:
            res["envstep"] = run_envstep(s, progress)
        if "collect" in args.sections:
            res["collect"] = run_collect(s, ray_cpus, progress)
        if "actors" in args.sections and s.actors:
            res["actors"] = run_actors(s, ray_cpus, progress)
    finally:
        if "bench.rllib_peer" in sys.modules:
            sys.modules["bench.rllib_peer"].shutdown()
    if "e2e" in args.sections:
        res["e2e"] = run_e2e(s, res.get("collect"), progress)
    res["seconds"] = time.perf_counter() - progress.t0
    res["load_average_end"] = os.getloadavg()

    from bench import report

    out_dir, page = outputs(args)
    paths = report.write(res, out_dir=out_dir, docs=page)
    print()
    print(paths["markdown_text"])
    print()
    for k, v in paths.items():
        if k != "markdown_text":
            print(f"{k}: {v}")
    if page is None:
        print(f"docs/ left as it was (--update-docs splices these tables into {_shown(args.docs)})")
    print(f"done in {res['seconds'] / 60:.1f} min", flush=True)
    return res
