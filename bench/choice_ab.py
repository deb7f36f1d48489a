"""The tuner's choice under another revision of Auturi against this checkout's, measured
interleaved: did a change to the tuner choose better layouts?

For each workload, ``tune`` (the ``model`` strategy, the bench sizing) runs in a fresh process
under the reference revision (a ``git worktree`` of ``--ref``, made once under ``/tmp``) and
under this checkout, alternating which goes first; then every distinct choice, the serial
config and SB3's ``DummyVecEnv`` and ``SubprocVecEnv`` are measured in the same interleaved
rounds by this checkout's executor (the executor is not what is compared: the layouts are).

Run: python -m bench.choice_ab --ref a84615d --workloads slow heavytail halfcheetah --repeats 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import machine_header, median_spread, save_and_print

REPO = Path(__file__).resolve().parents[1]

_TUNE = """
import json, sys, time
from bench.tune_quality import tune
from bench.workloads import get_workload
r, secs = tune(get_workload(sys.argv[1]), "model", max_samples=6)
print("RESULT " + json.dumps({"choice": r.choice.to_dict(), "seconds": secs, "trials": len(r.trials),
                              "tuned_throughput": r.throughput}))
"""


def worktree(ref: str) -> Path:
    """A checkout of ``ref`` beside this one (made once; reused while it exists)."""
    sha = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    path = Path(f"/tmp/auturi_ref_{sha}")
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True,
                       capture_output=True)
    return path


def tune_in(tree: Path, workload: str) -> dict:
    """``tune`` of ``workload`` in a fresh process importing Auturi (and the bench) from ``tree``."""
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{tree}")
    proc = subprocess.run([sys.executable, "-c", _TUNE, workload], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"tune under {tree} failed:\n{proc.stderr[-2000:]}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="the git revision to compare against")
    ap.add_argument("--workloads", nargs="+", default=["slow", "heavytail"])
    ap.add_argument("--repeats", type=int, default=2, help="tunes per revision and workload")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="bench/results/choice_ab.json")
    args = ap.parse_args(argv)
    from auturi import Config
    from bench.tune_quality import final_round
    from bench.workloads import available_workloads

    import torch  # noqa: F401  (versions in the header)
    import stable_baselines3  # noqa: F401

    trees = {"ref": worktree(args.ref), "head": REPO}
    out = {"machine": machine_header(), "command": "python -m bench.choice_ab " + " ".join(argv or sys.argv[1:]),
           "ref": args.ref, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "workloads": []}
    print(out["machine"], flush=True)
    for w in available_workloads(args.workloads):
        name = w.name
        runs: dict[str, list[dict]] = {"ref": [], "head": []}
        for i in range(args.repeats):
            for side in (("ref", "head") if i % 2 == 0 else ("head", "ref")):
                r = tune_in(trees[side], name)
                runs[side].append(r)
                print(f"{name:10s} {side:4s} {r['seconds']:6.1f}s {r['trials']:3d} trials -> "
                      f"{Config.from_dict(r['choice'])}", flush=True)
        configs = {"serial": Config.serial(w.num_envs)}
        labels: dict[str, str] = {}
        for side, rs in runs.items():
            for k, r in enumerate(rs):
                cfg = Config.from_dict(r["choice"])
                key = next((n for n, c in configs.items() if c == cfg), None)
                if key is None:
                    key = f"{side}_{k}"
                    configs[key] = cfg
                labels[f"{side}_{k}"] = key
        final = final_round(w, configs, args.rounds)
        med = {k: m for k, (m, _, _) in final.items()}
        row = {"workload": name, "runs": runs, "labels": labels,
               "configs": {k: str(c) for k, c in configs.items()},
               "final": {k: {"median": m, "spread": sp, "samples": xs} for k, (m, sp, xs) in final.items()}}
        for side in runs:
            picked = [med[labels[f"{side}_{k}"]] for k in range(len(runs[side]))]
            row[side] = {"median_of_choices": median_spread(picked)[0], "tune_seconds": [r["seconds"] for r in runs[side]]}
        row["head_vs_ref"] = row["head"]["median_of_choices"] / row["ref"]["median_of_choices"]
        row["head_vs_best_peer"] = row["head"]["median_of_choices"] / max(med["dummy"], med["subproc"])
        out["workloads"].append(row)
        print(f"{name:10s} head's choices {row['head_vs_ref']:.2f}x ref's; {row['head_vs_best_peer']:.2f}x the best "
              f"SB3 vector env", flush=True)
    return save_and_print(out, args.out, markdown)


def markdown(out: dict) -> str:
    lines = [f"Machine: {out['machine']}  ", f"Command: `{out['command']}` ({out['started']})", "",
             "| workload | ref's choices | this checkout's choices | tune s (ref / this) | ref steps/s | this steps/s "
             "| this / ref | this / best SB3 |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in out["workloads"]:
        def choices(side: str) -> str:
            return "; ".join(r["configs"][r["labels"][f"{side}_{k}"]].replace("|", "/")  # a table cell
                             for k in range(len(r["runs"][side])))

        secs = " / ".join(f"{sum(r[s]['tune_seconds']) / len(r[s]['tune_seconds']):.0f}" for s in ("ref", "head"))
        lines.append(f"| {r['workload']} | {choices('ref')} | {choices('head')} | {secs} | "
                     f"{r['ref']['median_of_choices']:,.0f} | {r['head']['median_of_choices']:,.0f} | "
                     f"{r['head_vs_ref']:.2f}x | {r['head_vs_best_peer']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
