"""Off-policy SB3 through ``auturi.wrap(model)`` (issue 16): three measurements.

1. ``learn`` end to end, runs alternated: plain SB3 with ``DummyVecEnv`` and with
   ``SubprocVecEnv`` against ``auturi.wrap(model)`` (the online tuner, its search included)
   and a fixed layout (``--config``). Workloads: SAC and TD3 on a MuJoCo env (``--mujoco``,
   HalfCheetah-v5 by default; Pendulum-v1 where MuJoCo is missing) with 8 envs, DQN on
   CartPole-v1. Target: the default at least 0.97x plain SB3 everywhere.
2. Learning parity: the mean return of the last episodes, SB3 vs wrapped, per seed (SAC on
   Pendulum, DQN on CartPole, ``--parity-seeds``).
3. Per-collect cost: microseconds per ``executor.collect(1)`` (what a ``train_freq=1`` step
   costs) under serial, one actor with env degree 2 and 4, and two actors, beside plain SB3's
   ``predict`` + ``step`` on ``DummyVecEnv`` and ``SubprocVecEnv``, with the SAC actor on the
   MuJoCo env, measured in interleaved rounds (``--per-collect`` runs this section alone).
4. The face's own cost per 1-step collect (``--face``): SB3's ``collect_rollouts`` against the
   wrapped one, each less its env and policy work, with the acting weights written between
   collects as training does (see :class:`_FaceCollect`).

Run (the lead's numbers, on a quiet machine):
    python -m bench.offpolicy --steps 20000 --repeats 2 --parity-steps 30000 --parity-seeds 2
Per-collect only: python -m bench.offpolicy --per-collect [--collects 500 --rounds 5]
The face's own per-collect cost (4.): python -m bench.offpolicy --face --algos sac,dqn [--collects 500 --rounds 9]
In one process, chunks alternated: python -m bench.offpolicy --interleaved 10 --steps 2000 --algos sac,td3,dqn
Parity only: python -m bench.offpolicy --parity-only --parity-steps 30000 --parity-seeds 2
Smoke (seconds): python -m bench.offpolicy --tiny
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from bench.common import machine_header, paired_ratios, rotated, summarize

KINDS = ("dummy", "subproc", "wrap", "wrap_subproc", "fixed")
"""``wrap_subproc``: the default ``auturi.wrap`` of a model built on a SubprocVecEnv (a
SubprocVecEnv user adding the one line: the search starts from an env worker per env)."""


def mujoco_env(preferred: str) -> str:
    """``preferred`` when gymnasium can make it (MuJoCo installed), else Pendulum-v1."""
    import gymnasium as gym

    if preferred.startswith("auturi/"):
        import auturi.envs.testing  # noqa: F401 - registers the ids
    try:
        gym.make(preferred).close()
        return preferred
    except Exception:  # noqa: BLE001 - any missing dependency: fall back, and say so in the record
        return "Pendulum-v1"


DQN_CARTPOLE = {"learning_rate": 2.3e-3, "batch_size": 64, "learning_starts": 1000, "gamma": 0.99,
                "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
                "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]}}
"""rl-baselines3-zoo's tuned DQN for CartPole-v1 (its hyperparams/dqn.yml; 50k steps): the
learning-parity runs use it because SB3's DQN defaults do not learn CartPole in a bench's
budget, so a parity of two non-learning runs would say nothing."""


def make_model(algo: str, env_id: str, n_envs: int, seed: int, kind: str, tiny: bool, hyper: dict | None = None):
    """The model (SB3 defaults but small buffers, ``hyper`` over them), on DummyVecEnv or SubprocVecEnv."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    vec_cls = SubprocVecEnv if kind in ("subproc", "wrap_subproc") else DummyVecEnv
    env_kwargs = None
    if env_id.startswith("auturi/"):  # auturi's test envs (auturi/Slow-v0: 1 ms a step); Box actions off-policy
        env_kwargs = {"action": "discrete" if algo == "dqn" else "box"}
        env_id = "auturi.envs.testing:" + env_id  # gymnasium imports the module first (SubprocVecEnv's workers too)
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, vec_env_cls=vec_cls, env_kwargs=env_kwargs)
    kw = {"buffer_size": 100_000, "seed": seed, "device": "cpu", "verbose": 0}
    if tiny:
        kw.update(learning_starts=32, batch_size=32, policy_kwargs={"net_arch": [32, 32]})
    kw = {"train_freq": 4 if algo == "dqn" else 1, **kw, **(hyper or {})}
    if algo == "dqn":
        kw.setdefault("learning_starts", 1000)
    return getattr(sb3, algo.upper())("MlpPolicy", env, **kw)


def learn_in_new_process(*args, **kwargs) -> dict:
    """:func:`learn_once` in a Python process of its own: a user's run, whose worker processes
    and forkservers start from nothing (in one bench process, the forkservers a first run
    started serve every later one, and SubprocVecEnv's workers find SB3 imported)."""
    import subprocess

    code = ("import json, sys, torch; from bench.offpolicy import learn_once; torch.set_num_threads(1); "  # as main()
            "a = json.loads(sys.argv[1]); print('RESULT' + json.dumps(learn_once(*a[0], **a[1])))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps([args, kwargs])], capture_output=True, text=True,
                          check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[len("RESULT"):])
    raise RuntimeError(f"the run in a new process failed:\n{done.stderr[-3000:]}")


def learn_once(algo: str, env_id: str, n_envs: int, steps: int, seed: int, kind: str, config_json: str | None,
               tiny: bool, hyper: dict | None = None, fresh_cache: bool = False) -> dict:
    """One timed ``learn`` of ``kind``; returns its seconds, ``build_seconds`` (the VecEnv, the
    model and the wrap before it: SubprocVecEnv's workers start there, a fixed config's too),
    the last episodes' mean return, the layout. ``fresh_cache``: the wrapped run's tuner starts
    from an empty cache (a user's first run)."""
    import tempfile

    import numpy as np

    import auturi

    t_build = time.perf_counter()
    model = make_model(algo, env_id, n_envs, seed, kind, tiny, hyper)
    cache_dir = tempfile.TemporaryDirectory(prefix="auturi-bench-cache-") if fresh_cache else None
    wrapped = kind in ("wrap", "wrap_subproc", "fixed")
    if kind in ("wrap", "wrap_subproc"):
        auturi.wrap(model, **({"tuner_options": {"cache": cache_dir.name}} if cache_dir else {}))
    elif kind == "fixed":
        auturi.wrap(model, config=auturi.Config.from_json(config_json))
    try:
        t0 = time.perf_counter()
        model.learn(steps)
        secs = time.perf_counter() - t0
        build = t0 - t_build
        eps = list(model.ep_info_buffer)[-20:]
        layout = str(model.auturi.config) if wrapped else kind
    finally:
        if wrapped:
            auturi.unwrap(model)
        model.env.close()
        if cache_dir is not None:
            cache_dir.cleanup()
    return {"algo": algo, "env": env_id, "kind": kind, "seed": seed, "seconds": secs, "build_seconds": build,
            "layout": layout,
            "return": float(np.mean([e["r"] for e in eps])) if eps else float("nan")}


PER_COLLECT_LAYOUTS = {
    "serial": '{"num_actors": 1, "envs_per_actor": N}',
    "degree_2": '{"num_actors": 1, "envs_per_actor": N, "env_parallel_degree": 2}',
    "degree_4": '{"num_actors": 1, "envs_per_actor": N, "env_parallel_degree": 4}',
    "two_actors": '{"num_actors": 2, "envs_per_actor": N/2}',
}


class _Sb3Step:
    """Plain SB3's share of one ``train_freq=1`` step: ``predict`` on the last observations
    (SAC's ``_sample_action`` after ``learning_starts``) and ``env.step``."""

    def __init__(self, env_id: str, n_envs: int, kind: str, tiny: bool = False):
        self.model = make_model("sac", env_id, n_envs, 0, kind, tiny)
        self.obs = self.model.env.reset()

    def __call__(self) -> None:
        actions, _ = self.model.predict(self.obs, deterministic=False)
        self.obs = self.model.env.step(actions)[0]

    def close(self) -> None:
        self.model.env.close()


class _Collect1:
    """``executor.collect(1)`` of a wrapped SAC under ``config``."""

    def __init__(self, env_id: str, n_envs: int, config, tiny: bool = False):
        import auturi

        self.model = auturi.wrap(make_model("sac", env_id, n_envs, 0, "dummy", tiny), config=config)
        self.ex = self.model.auturi.executor
        self.ex.set_policy_state(self.model.auturi.state(self.model))

    def __call__(self) -> None:
        self.ex.collect(1)

    def close(self) -> None:
        import auturi

        auturi.unwrap(self.model)
        self.model.env.close()


def _timed(step, collects: int) -> float:
    """Median microseconds of ``collects`` calls of ``step`` (after 10 unmeasured: first-touch
    pages, torch's thread calibration, workers' first wake-ups)."""
    for _ in range(10):
        step()
    us = []
    now = time.perf_counter
    for _ in range(collects):
        t0 = now()
        step()
        us.append((now() - t0) * 1e6)
    return statistics.median(us)


def per_collect(env_id: str, n_envs: int, collects: int, rounds: int, layouts=None, tiny: bool = False) -> dict:
    """Microseconds per 1-step collect (what a ``train_freq=1`` step costs before training):
    the wrapped SAC's executor under each layout of ``layouts`` (name -> Config JSON, ``N``
    standing for ``n_envs``; default :data:`PER_COLLECT_LAYOUTS`) beside plain SB3's
    ``predict`` + ``step`` on ``DummyVecEnv`` and ``SubprocVecEnv``, all built first and then
    measured in ``rounds`` interleaved rounds of ``collects`` calls (each sample a median).
    SAC's default MLP (256x256) unless ``tiny`` (32x32, for smoke runs)."""
    import auturi
    from bench.common import interleave

    makers = {"sb3_dummy": lambda: _Sb3Step(env_id, n_envs, "dummy", tiny),
              "sb3_subproc": lambda: _Sb3Step(env_id, n_envs, "subproc", tiny)}
    for name, text in (layouts or PER_COLLECT_LAYOUTS).items():
        config = auturi.Config.from_json(text.replace("N/2", str(n_envs // 2)).replace("N", str(n_envs)))
        makers[name] = lambda config=config: _Collect1(env_id, n_envs, config, tiny)
    runners: dict = {}
    try:
        for name, make in makers.items():
            runners[name] = make()
        samples = interleave(runners, rounds, lambda name, r: _timed(r, collects))
    finally:
        for r in runners.values():
            r.close()
    out = {}
    for name, xs in samples.items():
        row = summarize(xs)
        if isinstance(runners[name], _Collect1):
            row["config"] = str(runners[name].ex.config)
        out[name] = row
    base = out["sb3_dummy"]["median"]
    for row in out.values():
        row["vs_sb3_dummy"] = row["median"] / base
    return out


class _FaceCollect:
    """One ``collect_rollouts`` of ``train_freq=1`` (what SB3's ``learn`` runs between two
    gradient steps), of plain SB3 on DummyVecEnv or of the wrapped model (the default: online
    tuner, run until it locks in). Each call first writes the acting weights in place, untimed,
    as a gradient step does (so the face publishes as in training), then times the collect and,
    apart, its env and policy work: the executor's collect (wrapped) or ``predict`` + ``step``
    (SB3). What is left, ``outer``, is each loop's own per-collect cost: the replay, callbacks,
    buffer writes, publish, tuner and logging."""

    def __init__(self, algo: str, env_id: str, n_envs: int, wrapped: bool, tiny: bool = False):
        import auturi

        self.model = m = make_model(algo, env_id, n_envs, 0, "dummy", tiny)
        m.learning_starts, m.train_freq = 0, m.train_freq._replace(frequency=1)
        self.wrapped, self.inner = wrapped, 0.0
        if wrapped:
            auturi.wrap(m)
        _, self.callback = m._setup_learn(10**9, None, True, "face", False)
        self.callback.on_training_start(locals(), globals())
        parts = [(m.auturi.executor, "collect")] if wrapped else [(m, "predict"), (m.env, "step_async"),
                                                                  (m.env, "step_wait")]
        for obj, name in parts:
            setattr(obj, name, self._timed(getattr(obj, name)))
        acting = getattr(m.policy, "actor", None) or getattr(m.policy, "q_net", None) or m.policy
        self.params = list(acting.parameters())
        tuner = m.auturi.tuner if wrapped else None
        for _ in range(5000 if tuner is not None else 20):
            self.collect()
            if tuner is not None and tuner.phase == "locked":
                break

    def _timed(self, f):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self.inner += time.perf_counter() - t0
        return call

    def collect(self) -> None:
        m = self.model
        m.collect_rollouts(m.env, callback=self.callback, train_freq=m.train_freq, replay_buffer=m.replay_buffer,
                           action_noise=m.action_noise, learning_starts=0, log_interval=4)

    def sample(self, collects: int) -> tuple[float, float]:
        """Median microseconds per collect: total and outer."""
        import torch

        total, outer = [], []
        for _ in range(collects):
            with torch.no_grad():
                for p in self.params:
                    p.mul_(1.0)  # a new version, as an optimizer step makes
            self.inner = 0.0
            t0 = time.perf_counter()
            self.collect()
            t = time.perf_counter() - t0
            total.append(t * 1e6)
            outer.append((t - self.inner) * 1e6)
        return statistics.median(total), statistics.median(outer)

    def close(self) -> None:
        import auturi

        if self.wrapped:
            auturi.unwrap(self.model)
        self.model.env.close()


def face_cost(algos: list[str], env_id: str, n_envs: int, collects: int, rounds: int, tiny: bool = False) -> dict:
    """Per 1-step collect, plain SB3's ``collect_rollouts`` vs the wrapped model's (see
    :class:`_FaceCollect`), rounds interleaved; ``outer_extra_us``: the face's own cost over
    SB3's loop (median of the per-round differences)."""
    out: dict = {}
    for algo in algos:
        env = env_id if algo != "dqn" else "CartPole-v1"
        runners = {"sb3": _FaceCollect(algo, env, n_envs, False, tiny),
                   "wrap": _FaceCollect(algo, env, n_envs, True, tiny)}
        try:
            rows = {k: [] for k in runners}
            for i in range(rounds):
                for k in rotated(list(runners), i):
                    rows[k].append(runners[k].sample(collects))
        finally:
            for r in runners.values():
                r.close()
        res = {k: {"total_us": statistics.median(x[0] for x in xs), "outer_us": statistics.median(x[1] for x in xs)}
               for k, xs in rows.items()}
        res["outer_extra_us"] = statistics.median(w[1] - s[1] for w, s in zip(rows["wrap"], rows["sb3"]))
        res["env"] = env
        out[algo] = res
        print(f"face {algo} {env}: SB3 {res['sb3']['total_us']:.0f} us/collect (outer {res['sb3']['outer_us']:.0f}), "
              f"wrapped {res['wrap']['total_us']:.0f} (outer {res['wrap']['outer_us']:.0f}); the face's outer over "
              f"SB3's: {res['outer_extra_us']:+.0f} us", flush=True)
    return out


def print_per_collect(res: dict) -> None:
    for name, row in res.items():
        print(f"{name:12s} {row['median']:8.0f} us/collect ±{100 * row['spread']:.0f}%  "
              f"{row['vs_sb3_dummy']:.2f}x DummyVecEnv  {row.get('config', '')}", flush=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mujoco", default="HalfCheetah-v5",
                    help="SAC/TD3's env (a gymnasium id; auturi/Slow-v0: a 1 ms step, as a remote simulator's)")
    ap.add_argument("--dqn-env", default="CartPole-v1", help="DQN's env (end to end and --interleaved)")
    ap.add_argument("--new-process", action="store_true",
                    help="end to end: each run in a Python process of its own (a user's run: nothing started before)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="end to end: each wrapped run tunes from an empty cache (else the user's cache)")
    ap.add_argument("--n-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20_000, help="env steps per learn (all envs)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", default='{"num_actors": 1, "envs_per_actor": 8, "env_parallel_degree": 2}',
                    help="Config JSON of the 'fixed' variant")
    ap.add_argument("--parity-steps", type=int, default=30_000)
    ap.add_argument("--parity-seeds", type=int, default=2)
    ap.add_argument("--collects", type=int, default=500, help="1-step collects per per-collect sample")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the per-collect section")
    ap.add_argument("--per-collect", action="store_true",
                    help="only the per-collect section (us per 1-step collect, layouts and SB3 peers)")
    ap.add_argument("--face", action="store_true",
                    help="only the face's per-collect cost: SB3's collect_rollouts vs the wrapped one (--algos)")
    ap.add_argument("--parity-only", action="store_true",
                    help="only the learning-parity section (SB3 vs wrapped returns per seed)")
    ap.add_argument("--tiny", action="store_true", help="smoke run: a few hundred steps, small nets")
    ap.add_argument("--algos", default="sac,td3,dqn", help="comma-separated subset of sac,td3,dqn (end to end)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated subset of {','.join(KINDS)} (end to end; dummy is the reference)")
    ap.add_argument("--e2e-only", action="store_true", help="only the end-to-end section (no parity, no per-collect)")
    ap.add_argument("--interleaved", type=int, metavar="ROUNDS", default=0,
                    help="only end to end in one process: plain and wrapped learn in alternated chunks (--steps "
                         "each), this many rounds (see interleaved())")
    ap.add_argument("--no-control", action="store_true",
                    help="--interleaved without the second plain model (the plain-against-plain control)")
    ap.add_argument("--out", default="bench/results/offpolicy.json")
    args = ap.parse_args(argv)
    kinds = [k for k in KINDS if k in args.kinds.split(",")]
    if "dummy" not in kinds or set(args.kinds.split(",")) - set(KINDS):
        ap.error(f"--kinds: a subset of {','.join(KINDS)} with dummy in it, got {args.kinds!r}")
    if args.tiny:
        args.steps, args.repeats, args.parity_steps, args.parity_seeds, args.collects = 256, 1, 256, 1, 50
        args.rounds = 2
        args.n_envs = 4
        args.config = '{"num_actors": 1, "envs_per_actor": 4, "env_parallel_degree": 2}'
    import torch

    torch.set_num_threads(1)
    mujoco = mujoco_env(args.mujoco)
    out = {"machine": machine_header(), "command": "python -m bench.offpolicy " + " ".join(argv or sys.argv[1:]),
           "mujoco_env": mujoco, "e2e": [], "parity": [], "collect_us": None}
    print(out["machine"], f"MuJoCo env: {mujoco}", sep="\n", flush=True)
    if args.per_collect:
        out["collect_us"] = per_collect(mujoco, args.n_envs, args.collects, args.rounds, tiny=args.tiny)
        print_per_collect(out["collect_us"])
        return _save(out, args.out.replace(".json", "_per_collect.json"))
    if args.face:
        out["face_us"] = face_cost(args.algos.split(","), mujoco, args.n_envs, args.collects, args.rounds, args.tiny)
        return _save(out, args.out.replace(".json", "_face.json"))
    if args.interleaved:
        out["interleaved"] = interleaved(args.algos.split(","), mujoco, args.n_envs, args.steps, args.interleaved,
                                         args.tiny, control=not args.no_control, dqn_env=args.dqn_env)
        return _save(out, args.out.replace(".json", "_interleaved.json"))
    if args.parity_only:
        out["parity"] = parity(args.parity_steps, args.parity_seeds, args.tiny)
        return _save(out, args.out.replace(".json", "_parity.json"))
    workloads = [("sac", mujoco, args.n_envs), ("td3", mujoco, args.n_envs), ("dqn", args.dqn_env, args.n_envs)]
    workloads = [w for w in workloads if w[0] in args.algos.split(",")]
    for algo, env_id, n in workloads:
        for rep in range(args.repeats):
            for kind in rotated(kinds, rep):  # alternated and rotated: drift and position hit each alike
                run = learn_in_new_process if args.new_process else learn_once
                r = run(algo, env_id, n, args.steps, rep, kind, args.config, args.tiny, fresh_cache=args.fresh_cache)
                out["e2e"].append(r)
                print(f"{algo} {env_id} {kind:8s} seed {rep}: {r['seconds']:7.2f}s (+{r['build_seconds']:.2f}s "
                      f"building) return {r['return']:8.1f} {r['layout']}", flush=True)
    out["summary"] = _summary(out["e2e"])
    if args.e2e_only:
        print(json.dumps(out["summary"], indent=1))
        return _save(out, args.out)
    out["parity"] = parity(args.parity_steps, args.parity_seeds, args.tiny)
    out["collect_us"] = per_collect(mujoco, args.n_envs, args.collects, args.rounds, tiny=args.tiny)
    print_per_collect(out["collect_us"])
    out["summary"] = _summary(out["e2e"])
    print(json.dumps(out["summary"], indent=1))
    return _save(out, args.out)


def interleaved(algos: list[str], env_id: str, n_envs: int, chunk: int, rounds: int, tiny: bool,
                control: bool = True, dqn_env: str = "CartPole-v1") -> dict:
    """``learn`` end to end with the runs in one process: a plain SB3 model (DummyVecEnv), an
    ``auturi.wrap(model)`` one (the default: online tuning) and, with ``control``, a second
    plain model built like the first, then ``learn`` in chunks of ``chunk`` steps rotated
    between them, ``rounds`` times each, ``collect_rollouts`` and ``train`` timed apart.
    Per-process runs of 15 s read +-8% here from one run to the next (the host); chunks
    seconds apart share its state, so the ratio of a round's chunks measures what the wrap
    itself costs. The control (plain against plain, the same work) shows how far that ratio
    moves with no difference at all: on this host a DQN CartPole chunk of 4,000 steps read
    0.67-1.36x against its twin. Each ratio: the median of the rounds' ratios with its
    distribution-free 95% interval (``auturi.tuner.measure.median_interval``)."""
    import auturi

    kinds = ("dummy", "wrap") + (("control",) if control else ())
    out = {}
    for algo in algos:
        env = dqn_env if algo == "dqn" else env_id
        models, acc = {}, {}
        for kind in kinds:
            m = make_model(algo, env, n_envs, 0, "dummy", tiny)
            if kind == "wrap":
                auturi.wrap(m)
            acc[kind] = a = {"collect": 0.0, "train": 0.0}
            for name in ("collect_rollouts", "train"):
                setattr(m, name, _phase_timer(getattr(m, name), a, name.split("_")[0]))
            m.learn(chunk)  # learning_starts, warm-up and the tuner's first collects: not measured
            models[kind] = m
        rows: dict[str, list] = {kind: [] for kind in kinds}
        for r in range(rounds):
            order = rotated(kinds, r)
            for kind in (order if r % 2 == 0 else order[::-1]):  # every kind in every position alike
                a = acc[kind]
                a.update(collect=0.0, train=0.0)
                t0 = time.perf_counter()
                models[kind].learn(chunk, reset_num_timesteps=False)
                rows[kind].append({"seconds": time.perf_counter() - t0, **a})
        tuner = getattr(models["wrap"].auturi, "tuner", None)
        rec = {"env": env, "chunk": chunk, "rounds": rows, "layout": str(models["wrap"].auturi.config),
               "phase": tuner.phase if tuner is not None else None}
        for name in kinds[1:]:  # dummy's time over wrap's (or the control's): above 1, dummy is slower
            pairs = list(zip(rows["dummy"], rows[name]))
            rec[f"paired_{name}"] = {part: _median_and_interval([d[part] / o[part] for d, o in pairs])
                                     for part in ("seconds", "collect", "train")}
        rec["paired"] = {part: v["median"] for part, v in rec["paired_wrap"].items()}
        out[algo] = rec
        for name in kinds[1:]:
            p = rec[f"paired_{name}"]
            print(f"interleaved {algo} {env}: {name} vs DummyVecEnv " + ", ".join(
                f"{part} {v['median']:.3f}x [{v['low']:.3f}, {v['high']:.3f}]" for part, v in p.items())
                + f" (medians of {rounds} rounds, {p['seconds']['confidence']:.0%} intervals)"
                + (f" {rec['layout']}" if name == "wrap" else ""),
                flush=True)
        auturi.unwrap(models["wrap"])
        for m in models.values():
            m.env.close()
    return out


def _median_and_interval(ratios: list[float]) -> dict:
    from auturi.tuner.measure import median_interval

    med, lo, hi, conf = median_interval(ratios)
    return {"median": med, "low": lo, "high": hi, "confidence": conf, "n": len(ratios)}


def _phase_timer(f, acc: dict, key: str):
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - t0
    return call


def parity(steps: int, seeds: int, tiny: bool, dqn_steps: int = 50_000) -> list[dict]:
    """Learning parity: the mean return of the last episodes, plain SB3 (DummyVecEnv) vs
    ``auturi.wrap(model)`` (the default path), SAC on Pendulum-v1 (1 env, ``steps``) and DQN
    on CartPole-v1 (1 env, :data:`DQN_CARTPOLE`, ``dqn_steps``), seeds 100, 101, ..."""
    runs = []
    for algo, env_id, n, hyper in (("sac", "Pendulum-v1", 1, None), ("dqn", "CartPole-v1", 1, DQN_CARTPOLE)):
        for seed in range(seeds):
            for kind in ("dummy", "wrap"):
                r = learn_once(algo, env_id, n, steps if algo == "sac" or tiny else dqn_steps, 100 + seed, kind,
                               None, tiny, None if tiny else hyper)
                runs.append(r)
                print(f"parity {algo} {env_id} {kind:6s} seed {100 + seed}: return {r['return']:8.1f} "
                      f"({r['seconds']:.1f}s)", flush=True)
    return runs


def _save(out: dict, path: str) -> dict:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return out


def _summary(runs: list[dict]) -> dict:
    """Per workload and kind: median seconds, the speed-up over plain DummyVecEnv of the medians,
    and seed-paired (each repeat's DummyVecEnv run against the same repeat's run of the kind):
    the geometric mean of those ratios, lowest and highest."""
    out: dict = {}
    for algo in sorted({r["algo"] for r in runs}):
        mine = [r for r in runs if r["algo"] == algo]
        base = {r["seed"]: r["seconds"] for r in mine if r["kind"] == "dummy"}
        out[algo] = {}
        for k in [k for k in KINDS if any(r["kind"] == k for r in mine)]:
            secs = {r["seed"]: r["seconds"] for r in mine if r["kind"] == k}
            p = paired_ratios(base, secs)
            whole = [r["seconds"] + r.get("build_seconds", 0.0) for r in mine if r["kind"] == k]
            out[algo][k] = {"median_seconds": statistics.median(secs.values()),
                            "median_with_build_seconds": statistics.median(whole),
                            "speedup_vs_dummy": statistics.median(base.values()) / statistics.median(secs.values()),
                            "paired_vs_dummy": p and {"geomean": p["geomean"], "min": p["min"], "max": p["max"],
                                                      "repeats": p["n"]}}
    return out


if __name__ == "__main__":
    main()
