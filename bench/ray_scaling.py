"""Actor scaling on a Ray cluster: Auturi's ``ray`` backend with 1, 2, 4, 8 Ray actors against
RLlib's own EnvRunners (``num_env_runners`` 1, 2, 4, 8) on the same envs and network.

What runs, per setting ``n`` (the total number of envs stays the workload's, or ``--envs``):

- **auturi**: ``make_executor(workload env, workload policy, envs, Config(num_actors=n,
  envs_per_actor=envs/n), backend="ray")``: ``n`` Ray actors, each stepping its envs one
  after another and running the policy in its own process (what an EnvRunner does), spread
  over the cluster's nodes by a ``SPREAD`` placement group. One sample = one ``collect``.
- **rllib**: :class:`bench.rllib_peer.RLlibRunner` with ``num_env_runners=n``,
  ``num_envs_per_env_runner=envs/n``, ``num_cpus_per_env_runner=1``, the workload's network as
  the RLModule. One sample = ``sample()`` on every runner, in parallel.

Each sample is ``--steps`` rows of every env, timed on this process's clock from the call to
the last actor's answer (the object transfers included); the table gives the median env steps
per second over ``--repeats`` samples, after one warm-up sample, with half the interquartile
range, and how many nodes the actors ran on. Settings run one after another, each with only
its own actors alive.

``--address ADDR`` connects to a running cluster (``ray start --head`` there; this repository's
``bench`` package is shipped to the workers with ``runtime_env={"py_modules": ...}``, Auturi
must be installed on every node); without it a local Ray instance sized to ``max(actors)``
logical CPUs is started and shut down. The figures mean something only where every actor has
a core of its own: ``--quick`` (1 and 2 actors, 4 envs, a few short samples) only checks that
the script runs, e.g. on a 2-core machine.

    python -m bench.ray_scaling --quick
    python -m bench.ray_scaling --address HEAD:6379 --workload cartpole --json scaling.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from bench.common import machine_header, median_spread
from bench.workloads import get_workload

ACTORS = (1, 2, 4, 8)


class AuturiRay:
    """Auturi's ``ray`` backend with ``n`` actors over ``num_envs`` envs."""

    kind = "auturi"

    def __init__(self, workload: Any, n: int, num_envs: int, steps: int):
        import auturi

        self.steps = steps
        self.ex = workload.make_executor(backend="ray", num_envs=num_envs,
                                         config=auturi.Config(num_actors=n, envs_per_actor=num_envs // n))

    def run(self) -> float:
        t0 = time.perf_counter()
        r = self.ex.collect(self.steps)
        return r.stats.steps / (time.perf_counter() - t0)

    def nodes(self) -> int:
        return len(set(self.ex.actor_nodes))

    def close(self) -> None:
        self.ex.close()


class RLlibRunners:
    """RLlib's EnvRunners (:class:`bench.rllib_peer.RLlibRunner`) with ``n`` remote runners."""

    kind = "rllib"

    def __init__(self, workload: Any, n: int, num_envs: int, steps: int):
        from bench.rllib_peer import RLlibRunner

        self.steps = steps
        self.runner = RLlibRunner(workload, num_env_runners=n, num_envs_per_env_runner=num_envs // n)

    def run(self) -> float:
        return self.runner.run(self.steps)

    def nodes(self) -> int:
        import ray

        group = self.runner.group
        assert group is not None
        return len(set(group.foreach_env_runner(lambda r: ray.get_runtime_context().get_node_id(),
                                                local_env_runner=False)))

    def close(self) -> None:
        self.runner.close()


def measure(kind: type, workload: Any, n: int, num_envs: int, steps: int, repeats: int) -> dict[str, Any]:
    """One setting: build, one warm-up sample (actors started, envs reset), ``repeats`` timed
    samples, close."""
    runner = kind(workload, n, num_envs, steps)
    try:
        runner.run()
        rates = [runner.run() for _ in range(repeats)]
        nodes = runner.nodes()
    finally:
        runner.close()
    med, spread = median_spread(rates)
    return {"steps_per_s": med, "spread": spread, "samples": rates, "nodes": nodes}


def connect(address: str | None, max_actors: int) -> bool:
    """Join the cluster at ``address`` (shipping ``bench`` to its workers) or start a local
    instance with one logical CPU per actor of the largest setting; nothing when this process
    is connected already. True when this call connected to ``address`` (then disconnect)."""
    import ray

    from bench import rllib_peer

    if ray.is_initialized():
        return False
    if address is None:
        rllib_peer.ensure_ray(max_actors)
        return False
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    ray.init(address=address, runtime_env={"py_modules": [bench_dir]}, log_to_driver=False,
             logging_level="ERROR")
    return True


def run(workload_name: str, actors: tuple[int, ...], num_envs: int | None, steps: int | None, repeats: int,
        address: str | None) -> dict[str, Any]:
    workload = get_workload(workload_name)
    envs = num_envs or workload.num_envs
    bad = [n for n in actors if envs % n]
    if bad:
        raise SystemExit(f"--envs {envs} does not split evenly over {bad} actors: pick a multiple of {max(actors)}")
    steps = steps or workload.num_steps
    joined = connect(address, max(actors))
    rows = []
    try:
        for n in actors:
            row = {"actors": n, "envs_per_actor": envs // n}
            for kind in (AuturiRay, RLlibRunners):
                row[kind.kind] = measure(kind, workload, n, envs, steps, repeats)
            rows.append(row)
            print(line(row), flush=True)
    finally:
        import ray

        from bench import rllib_peer

        rllib_peer.shutdown()
        if joined:
            ray.shutdown()
    return {"workload": workload.name, "envs": envs, "steps": steps, "repeats": repeats, "address": address,
            "machine": machine_header(), "rows": rows}


def line(row: dict[str, Any]) -> str:
    a, r = row["auturi"], row["rllib"]
    return (f"{row['actors']:6d} {row['envs_per_actor']:8d}   {a['steps_per_s']:10.0f} +-{a['spread']:4.0%} "
            f"({a['nodes']} nodes)   {r['steps_per_s']:10.0f} +-{r['spread']:4.0%} ({r['nodes']} nodes)   "
            f"{a['steps_per_s'] / r['steps_per_s']:6.2f}x")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="cartpole", help="a bench.workloads name (default cartpole)")
    ap.add_argument("--actors", default=",".join(map(str, ACTORS)), help="actor counts (default 1,2,4,8)")
    ap.add_argument("--envs", type=int, default=None, help="total envs (default: the workload's)")
    ap.add_argument("--steps", type=int, default=None, help="rows per sample (default: the workload's)")
    ap.add_argument("--repeats", type=int, default=7, help="timed samples per setting (default 7)")
    ap.add_argument("--address", default=None, help="a running Ray cluster (default: a local instance)")
    ap.add_argument("--quick", action="store_true", help="1 and 2 actors, 4 envs, 16 steps, 2 samples: it runs")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    actors = tuple(int(x) for x in args.actors.split(","))
    envs, steps, repeats = args.envs, args.steps, args.repeats
    if args.quick:
        actors, envs, steps, repeats = (1, 2), 4, 16, 2
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; workload {args.workload}, "
          f"address {args.address or 'local'}")
    print(f"{'actors':>6s} {'envs/act':>8s}   {'auturi steps/s':>26s}   {'rllib steps/s':>26s}   auturi/rllib")
    out = run(args.workload, actors, envs, steps, repeats, args.address)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
