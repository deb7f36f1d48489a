"""Does the status endpoint slow collection? Collection throughput with the status server
polled ten times a second, against the server idle and against no server at all.

Setting: CartPole-v1, the MLP 64x64 policy, 8 envs, 64 steps per collect, under two layouts:
the serial config (everything in this process, so it competes with the server thread for
the GIL: the worst case) and 2 actors (collection in worker processes, this process mostly
waits). The training path is reproduced: each collect publishes a status snapshot (as the
online tuner's callback does) and records the collect (``StatusSnapshot.record_collect``: the
page's throughput-over-time history, the counters and the time split), and the server answers
from that snapshot.

The poller is another process (a browser or Prometheus would be): while a flag file exists
it sends one request every 0.1 s on a keep-alive connection, cycling ``/status``, ``/trials``
and ``/history`` (what the page fetches while training; ``--paths`` changes the list).
Conditions run in interleaved rounds (none, idle, polled, rotated), so a drift of the machine
hits each alike; the result is the median of each condition's rounds and the ratio to
``none``, with the spread of the per-round ratios.

Run: python -m bench.server_overhead [--rounds 10] [--collects 15] [--layouts serial actors2]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

from bench.common import machine_header, median_spread

NUM_ENVS, NUM_STEPS = 8, 64
POLL_PERIOD = 0.1

_POLLER = r"""
import http.client, json, os, sys, time
from urllib.parse import urlsplit
url, flag, stats_path, period = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
paths = sys.argv[5].split(",")
u = urlsplit(url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)  # keep-alive, as a browser or Prometheus
lat, errors, i, nxt = [], 0, 0, time.monotonic()
while not os.path.exists(stats_path + ".stop"):
    nxt += period
    if os.path.exists(flag):
        for attempt in (0, 1):  # the server closes a keep-alive connection idle > 5 s: reconnect once
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/" + paths[i % len(paths)])
                conn.getresponse().read()
                lat.append(time.perf_counter() - t0)
                break
            except Exception:
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
                errors += attempt
        i += 1
    time.sleep(max(0.0, nxt - time.monotonic()))
json.dump({"latencies": lat, "errors": errors}, open(stats_path, "w"))
"""


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def fake_trials(n: int = 20) -> list[dict]:
    """A trial list the size of a real run's, for the server to serialise."""
    import auturi

    c = auturi.Config.serial(NUM_ENVS).to_dict()
    return [{"config": c, "source": "search", "status": "ok", "stop_reason": "converged", "error": None,
             "mean": 5000.0 + i, "half_width": 100.0, "n": 5, "samples": [5000.0 + i] * 5, "warmup": [4000.0],
             "reconfigure_seconds": 0.5, "predicted": 5500.0, "started": float(i), "seconds": 1.0}
            for i in range(n)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # this process, every thread (the server's too)
    return r.ru_utime + r.ru_stime


def run_round(ex, snap, collects: int, config) -> tuple[float, float]:
    """Steps/s of ``collects`` collects, and this process's CPU ms per 1000 steps."""
    from auturi.tuner import TunerEvent

    steps, t0, c0 = 0, time.perf_counter(), _cpu()
    for _ in range(collects):
        r = ex.collect(NUM_STEPS)
        steps += r.stats.steps
        if snap is not None:  # what the tuner's callback does after each sample
            snap(TunerEvent(kind="sample", status={"phase": "search", "trials": 20, "trials_ok": 20,
                                                   "best_throughput": 5000.0, "current_samples": 3},
                            value=r.stats.steps_per_second))
            snap.record_collect(r.stats, config)  # what the training face does after each collect
    return steps / (time.perf_counter() - t0), 1e6 * (_cpu() - c0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds per condition")
    ap.add_argument("--collects", type=int, default=15, help="collects per round")
    ap.add_argument("--layouts", nargs="+", default=["serial", "actors2"], choices=["serial", "actors2"])
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch threads in this process (the serial layout's inference); 1 keeps a shared "
                         "machine's noise down")
    ap.add_argument("--paths", nargs="+", default=["status", "trials", "history"], help="paths the poller cycles through")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    import torch

    import auturi
    from auturi.server import StatusServer, StatusSnapshot
    from bench.workloads import mlp_policy

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    print(machine_header())
    print(f"CartPole-v1, MLP 64x64, {NUM_ENVS} envs x {NUM_STEPS} steps/collect, {args.collects} collects/round, "
          f"{args.rounds} rounds/condition, torch threads {torch.get_num_threads()}; poll: one GET every {POLL_PERIOD} s cycling {args.paths}, from another "
          f"process\n")
    layouts = {"serial": auturi.Config.serial(NUM_ENVS), "actors2": auturi.Config(num_actors=2, envs_per_actor=4)}
    results = {}
    tmp = Path(tempfile.mkdtemp(prefix="auturi-bench-"))
    for name in args.layouts:
        cfg = layouts[name]
        snap = StatusSnapshot(hardware={"cpu_model": "bench"})
        snap.update(status={"phase": "search"}, trials=fake_trials())
        server = StatusServer(snap)
        url = server.start()
        flag, stats = tmp / f"{name}.poll", tmp / f"{name}.stats.json"
        poller = subprocess.Popen([sys.executable, "-c", _POLLER, url, str(flag), str(stats), str(POLL_PERIOD),
                                   ",".join(p.strip("/") for p in args.paths)])
        policy = mlp_policy(4, gym.spaces.Discrete(2))
        by: dict[str, list[float]] = {"none": [], "idle": [], "polled": []}
        cpu: dict[str, list[float]] = {"none": [], "idle": [], "polled": []}
        ratios: dict[str, list[float]] = {"idle": [], "polled": []}
        try:
            with auturi.make_executor(make_cartpole, policy, NUM_ENVS, config=cfg, backend="shm") as ex:
                for _ in range(3):
                    ex.collect(NUM_STEPS)  # warm up
                order = ["none", "idle", "polled"]
                for r in range(args.rounds):
                    got = {}
                    for cond in order[r % 3:] + order[:r % 3]:
                        if cond == "polled":
                            flag.touch()
                        time.sleep(0.3)  # the poller is in its stride (every condition waits alike)
                        got[cond], c = run_round(ex, None if cond == "none" else snap, args.collects, cfg)
                        cpu[cond].append(c)
                        if cond == "polled":
                            flag.unlink()
                        by[cond].append(got[cond])
                    for cond, xs in ratios.items():
                        xs.append(got[cond] / got["none"])
        finally:
            (tmp / f"{name}.stats.json.stop").touch()
            poller.wait(10)
            server.stop()
        polled = json.loads(stats.read_text()) if stats.exists() else {"latencies": [], "errors": -1}
        lat = sorted(polled["latencies"])
        res = {"config": str(cfg)}
        for cond, xs in by.items():
            med, spread = median_spread(xs)
            res[cond] = {"median": med, "spread": spread, "samples": xs,
                         "cpu_ms_per_1k_steps": statistics.median(cpu[cond])}
        for cond, xs in ratios.items():
            med, _ = median_spread(xs)
            res[f"{cond}/none"] = {"median": med, "min": min(xs), "max": max(xs), "samples": xs}
        res["requests"] = {"count": len(lat), "errors": polled["errors"],
                           "p50_ms": 1e3 * statistics.median(lat) if lat else None,
                           "p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))] if lat else None}
        results[name] = res
    print("| layout | no server (steps/s) | server idle | polled 10/s | idle / none | polled / none "
          "(min..max per round) | CPU ms / 1k steps: none, idle, polled | request p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        q = r["requests"]
        print(f"| {name} | {r['none']['median']:,.0f} +-{r['none']['spread']:.0%} "
              f"| {r['idle']['median']:,.0f} +-{r['idle']['spread']:.0%} "
              f"| {r['polled']['median']:,.0f} +-{r['polled']['spread']:.0%} "
              f"| {r['idle/none']['median']:.3f} | {r['polled/none']['median']:.3f} "
              f"({r['polled/none']['min']:.2f}..{r['polled/none']['max']:.2f}) "
              f"| {r['none']['cpu_ms_per_1k_steps']:.1f}, {r['idle']['cpu_ms_per_1k_steps']:.1f}, "
              f"{r['polled']['cpu_ms_per_1k_steps']:.1f} "
              f"| {q['p50_ms']:.1f} / {q['p99_ms']:.1f} ms ({q['count']} requests, {q['errors']} errors) |")
    for name, r in results.items():
        print(f"\n{name}: {r['config']}", end="")
    print("\n\n+-: half the interquartile range of the rounds, relative to their median. A ratio within the "
          "rounds' spread of 1.0 is no measurable slowdown. CPU: this process only (collection in the serial "
          "layout, plus the server thread), so polled - idle is what serving costs.")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_header(), "results": results}, indent=1))
    for p in tmp.iterdir():
        p.unlink()
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
