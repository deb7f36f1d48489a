"""How long a SIGKILLed owner's processes and /dev/shm names outlive it (issue 30 item 1).

For each layout and moment (idle between collects, or inside a collect of a 20 ms env), an owner
script builds an ``shm`` executor, collects, prints its workers' pids, its forkservers' and its
resource tracker's, and is killed with SIGKILL; this then polls every 5 ms until each is gone (a
zombie counts as gone) and no name of the owner is left in /dev/shm. Printed per case: the
median and the largest, over the runs, of the seconds until every worker was gone, until every
process (the forkservers and the tracker too) was gone, and until /dev/shm was clean.

Run: python -m bench.owner_death [--runs 5] [--torch] [--layouts actors replicas all]
(``--torch``: a torch policy, so policy processes fork from the torch forkserver, whose own
exit, torch's teardown, is the slowest part.)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

LAYOUTS = {
    "actors": {"num_actors": 2, "envs_per_actor": 4, "env_parallel_degree": 2},
    "replicas": {"num_actors": 1, "envs_per_actor": 4, "env_parallel_degree": 2, "policies_per_actor": 2,
                 "policy_batch_size": 2},
    "all": {"num_actors": 2, "envs_per_actor": 4, "env_parallel_degree": 2, "policies_per_actor": 2,
            "policy_batch_size": 2},
}

OWNER = textwrap.dedent("""
    import functools, json, multiprocessing.resource_tracker as tracker, os, sys, threading, time
    import gymnasium as gym
    import numpy as np
    from auturi import Config, make_executor
    from auturi.executor.shm import forkservers
    from auturi.policy import RandomPolicy

    class SlowEnv(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, marker):
            self.marker, self.steps = marker, 0

        def reset(self, *, seed=None, options=None):
            return np.zeros(4, np.float32), {}

        def step(self, action):
            self.steps += 1
            if self.steps > 3:  # inside the long collect (the first one has 2 steps)
                open(self.marker, "a").close()
            time.sleep(0.02)
            return np.zeros(4, np.float32), 1.0, False, False, {}

    config, when, marker, use_torch = Config(**json.loads(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    if use_torch:
        from auturi import TorchPolicy
        from auturi.nets import MLPActorCritic
        policy = TorchPolicy(functools.partial(MLPActorCritic, 4, 2), SlowEnv.action_space)
    else:
        policy = RandomPolicy(SlowEnv.action_space)
    n = config.num_actors * config.envs_per_actor
    ex = make_executor(lambda: SlowEnv(marker), policy, num_envs=n, config=config, backend="shm")
    ex.collect(2)
    print(json.dumps({"workers": [s.proc.pid for s in ex._slots],
                      "servers": [s._forkserver_pid for s in forkservers._servers.values() if s._forkserver_pid],
                      "tracker": tracker._resource_tracker._pid}), flush=True)
    if when == "collect":
        ex.collect(10_000)
    else:
        threading.Event().wait()
""")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def _names(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith((f"auturi_{pid}_", f"sem.auturi_{pid}_"))]


def one_run(layout: dict, when: str, use_torch: bool, limit: float = 30.0) -> tuple[float, float, float]:
    """(workers gone, every process gone, /dev/shm clean), seconds after the SIGKILL (inf: not within ``limit``)."""
    with tempfile.TemporaryDirectory() as tmp:
        script, marker = os.path.join(tmp, "owner.py"), os.path.join(tmp, "collecting")
        with open(script, "w") as f:
            f.write(OWNER)
        p = subprocess.Popen([sys.executable, script, json.dumps(layout), when, marker, str(int(use_torch))],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        info = json.loads(p.stdout.readline())
        while when == "collect" and not os.path.exists(marker):
            time.sleep(0.005)
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        p.wait()
        p.stdout.close()
        workers, everything = info["workers"], info["workers"] + info["servers"] + [info["tracker"]]
        times = [float("inf")] * 3
        while time.monotonic() - t0 < limit and float("inf") in times:
            now = time.monotonic() - t0
            for k, done in enumerate((lambda: all(map(_gone, workers)), lambda: all(map(_gone, everything)),
                                      lambda: not _names(p.pid))):
                if times[k] == float("inf") and done():
                    times[k] = now
            time.sleep(0.005)
        for q in everything:  # past the limit: leave nothing running
            if not _gone(q):
                os.kill(q, signal.SIGKILL)
        for n in _names(p.pid):
            os.unlink(os.path.join("/dev/shm", n))
        return times[0], times[1], times[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--layouts", nargs="+", default=sorted(LAYOUTS), choices=sorted(LAYOUTS))
    args = ap.parse_args()
    print(f"{'layout':10s} {'moment':8s} {'workers gone':>16s} {'all processes':>16s} {'/dev/shm clean':>16s}"
          "   (median / max seconds after SIGKILL)")
    for name in args.layouts:
        for when in ("idle", "collect"):
            runs = [one_run(LAYOUTS[name], when, args.torch) for _ in range(args.runs)]
            cols = ["{:.3f} / {:.3f}".format(statistics.median(c), max(c)) for c in zip(*runs)]
            print(f"{name:10s} {when:8s} " + " ".join(f"{c:>16s}" for c in cols), flush=True)


if __name__ == "__main__":
    main()
