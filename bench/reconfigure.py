"""Reconfigure cost between layouts that differ in one knob (issue 15: at least 3x faster than
a full restart of every worker and env, which is what a reconfigure did before the plan diff).

16 CartPole envs, a constant policy; per pair, one executor collects under ``A`` (so envs are
mid-episode), then switches ``A -> B -> A`` ``--rounds`` times, collecting between switches;
the median seconds of each direction are printed, with ``last_reconfigure`` when the
executor reports it. Run it against another checkout to compare (the script only uses
``Executor.reconfigure``'s return value, which every version has):

    python -m bench.reconfigure [--rounds 7] [--monitor] [--json out.json]

``--monitor`` wraps each env in SB3's ``Monitor``, as the ``env_fn`` SB3 users write does (and
SB3's ``make_vec_env``): a worker unpickling it imports SB3 and torch.
    PYTHONPATH=/path/to/old/checkout python /path/to/bench/reconfigure.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import gymnasium as gym

N = 16


def make_cartpole():
    return gym.make("CartPole-v1")


Monitor = None  # SB3's, imported by main() with --monitor: a global, as in a user's script


def make_monitored_cartpole():
    return Monitor(gym.make("CartPole-v1"))


def pairs():
    from auturi import Config

    deg2 = Config(envs_per_actor=N, env_parallel_degree=2)
    two = Config(num_actors=2, envs_per_actor=N // 2, env_parallel_degree=2, policies_per_actor=2,
                 policy_batch_size=4)
    return {
        "degree 2 -> 4": (deg2, deg2.replace(env_parallel_degree=4)),
        "batch 16 -> 8": (deg2, deg2.replace(policy_batch_size=8)),
        "2 actors, replica batch 4 -> 2": (two, two.replace(policy_batch_size=2)),
    }


def measure(a, b, rounds: int, env_fn=make_cartpole) -> dict:
    import auturi
    from auturi import make_executor

    policy = auturi.ConstantPolicy(gym.spaces.Discrete(2))
    there, back, reports = [], [], []
    with make_executor(env_fn, policy, num_envs=N, config=a, backend="shm") as ex:
        ex.collect(32)
        for _ in range(rounds):
            there.append(ex.reconfigure(b))
            reports.append(getattr(ex, "last_reconfigure", None))
            ex.collect(32)
            back.append(ex.reconfigure(a))
            ex.collect(32)
    return {"a_to_b_s": statistics.median(there), "b_to_a_s": statistics.median(back), "report": reports[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--monitor", action="store_true", help="envs wrapped in SB3's Monitor (as SB3 users' env_fn)")
    args = ap.parse_args()
    import auturi

    if args.monitor:
        global Monitor
        from stable_baselines3.common.monitor import Monitor

    print(f"auturi from {os.path.dirname(auturi.__file__)}; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    out = {}
    for name, (a, b) in pairs().items():
        r = out[name] = measure(a, b, args.rounds, make_monitored_cartpole if args.monitor else make_cartpole)
        print(f"{name:32s} A->B {r['a_to_b_s'] * 1e3:8.1f} ms   B->A {r['b_to_a_s'] * 1e3:8.1f} ms   {r['report'] or ''}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
