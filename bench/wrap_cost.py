"""What ``auturi.wrap(model)`` costs before ``learn`` starts, and where it goes
(``model.auturi.wrap_seconds``: envs rebuilt, executor started, the tuner's wrap-time look and
its moves), on SB3's Atari recipe: ``make_atari_env("PongNoFrameskip-v4", n)`` +
``VecFrameStack(4)``, CnnPolicy on cpu, from a ``DummyVecEnv`` model and from a
``SubprocVecEnv`` one, each wrapped by default (online tuning, empty cache) and with a fixed
layout. ``--cores 16`` has the online tuner plan for a 16-core machine (its wrap-time look then
moves to env workers, as on the H200 box of 2026-11-27) while the processes run on this one.

Each run is a fresh process (its forkservers, imports and envs start cold, as a user's script
does); systems alternate within a round. Prints and saves each run's seconds by phase, and the
caller's own CPU seconds in the wrap (``wrap_cpu``): the work one process does in turn, which
many cores do not share out, and a figure other jobs on the machine move less than wall time.

Run: python -m bench.wrap_cost [--envs 8] [--rounds 2] [--cores 16] [--out bench/results/wrap_cost.json]
Needs ale-py and SB3 (the ``atari`` and ``dev`` extras).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

SYSTEMS = ("dummy_online", "subproc_online", "dummy_fixed")

CHILD = r"""
import json, sys, time
import ale_py, gymnasium
gymnasium.register_envs(ale_py)  # at import: SubprocVecEnv's workers import this script

def main():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack
    import auturi

    kind, n, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cls = SubprocVecEnv if kind.startswith("subproc") else DummyVecEnv
    t0 = time.perf_counter()
    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=n, seed=0, vec_env_cls=cls), 4)
    model = PPO("CnnPolicy", env, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu", verbose=0)
    build = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    if kind.endswith("fixed"):
        model = auturi.wrap(model, config=auturi.Config(2, n // 2, max(1, n // 4), 1, "cpu", max(1, n // 4)))
    else:
        model = auturi.wrap(model, tuner_options={"cores": cores} if cores else None)
    wrap, wrap_cpu = time.perf_counter() - t0, time.process_time() - c0
    h = model.auturi
    print(json.dumps({"build": build, "wrap": wrap, "wrap_cpu": wrap_cpu, "phases": getattr(h, "wrap_seconds", {}),
                      "config": str(h.config)}))
    h.close()
    model.get_env().close()

if __name__ == "__main__":
    main()
"""


def run_one(kind: str, n: int, cores: int, script: str) -> dict[str, Any]:
    env = dict(os.environ, AUTURI_CACHE_DIR=tempfile.mkdtemp(prefix="auturi-wrap-cost-"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "src"), root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, script, kind, str(n), str(cores)], capture_output=True, text=True,
                         env=env, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"system": kind, "error": out.stderr.strip().splitlines()[-1:] or ["no output"]}
    return {"system": kind, **json.loads(lines[-1])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cores", type=int, default=16, help="cores the online tuner plans for (0: this machine's)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from bench.common import machine_header

    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "wrap_child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        runs = []
        for r in range(args.rounds):
            for kind in args.systems:
                rec = run_one(kind, args.envs, args.cores, script)
                rec["round"] = r
                runs.append(rec)
                p = rec.get("phases") or {}
                print(f"round {r} {kind:15s} " + (f"error {rec['error']}" if "error" in rec else
                      f"build {rec['build']:.2f} s, wrap {rec['wrap']:.2f} s, {rec.get('wrap_cpu', 0):.2f} s of the "
                      f"caller's CPU (envs {p.get('envs', 0):.2f}, "
                      f"executor {p.get('executor', 0):.2f}, look {p.get('tuner', 0):.2f}, moves "
                      f"{p.get('moves', 0):.2f}) -> {rec['config']}"), flush=True)
    out = {"machine": machine_header(), "command": "python -m bench.wrap_cost " + " ".join(argv or sys.argv[1:]),
           "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "envs": args.envs, "cores": args.cores,
           "runs": runs}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


if __name__ == "__main__":
    main()
