"""Markdown tables and PNG plots from a :mod:`bench.suite` results dict, and splicing them
into ``docs/benchmarks.md`` between the markers (the rest of the page is left byte for byte).

Example:
    >>> from bench.report import splice
    >>> splice("intro\\n<!-- bench:begin -->\\nold\\n<!-- bench:end -->\\nrest\\n", "new")
    'intro\\n<!-- bench:begin -->\\nnew\\n<!-- bench:end -->\\nrest\\n'
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
FULL_MINUTES = "45"  # a full run's wall time on a quiet 2-core machine: the earlier measured 25 min plus an
# estimate for the football workload and the TorchRL / PufferLib peers (issue 19); the lead's full run will confirm it

PEER_TEXT = {
    "auturi_tuned": "Auturi, the `model` strategy's choice (tuned in this run), on a fresh shm executor",
    "auturi_fixed": "Auturi, its best fixed config: the `grid` strategy's choice (every config measured) from "
                    "`bench/results/tune_quality.json`",
    "dummy": "SB3 `DummyVecEnv` (envs one after another in the caller)",
    "subproc": "SB3 `SubprocVecEnv` (one process per env, pipes; started with `fork`, which changes only the "
               "untimed start-up)",
    "async": "gymnasium `AsyncVectorEnv` (one process per env, `shared_memory=True`)",
    "envpool": "EnvPool sync mode (`batch_size = num_envs`, `num_threads = min(cores, num_envs)`)",
    "envpool_async": "EnvPool async mode (`batch_size = num_envs // 2`; the policy acts on each batch as it "
                     "arrives)",
    "rllib_0": "RLlib `SingleAgentEnvRunner` in the caller (`num_env_runners=0`, all envs in one gymnasium "
               "`SyncVectorEnv`)",
    "rllib_2": "RLlib `EnvRunnerGroup`, `num_env_runners=2` Ray actors, `num_envs_per_env_runner = num_envs / 2`",
    "pufferlib": "PufferLib (`pufferlib-core`) `vector.Multiprocessing`, `num_workers = min(cores, N)`, "
                 "`batch_size = N` (synchronous)",
    "pufferlib_async": "the same with `batch_size = N / 2` (PufferLib's `auto`; the policy acts on the first half "
                       "of the envs to finish)",
    "torchrl_sync": "TorchRL `Collector` (`SyncDataCollector` before 0.14) over `ParallelEnv(W, SerialEnv(N / W))`, "
                    "`W = min(cores, N)` processes, the policy batched in the caller",
    "torchrl_multisync": "TorchRL `MultiSyncCollector`: `W = min(cores, N)` worker processes, each a collector over "
                         "`SerialEnv(N / W)` with its own policy copy (1 torch thread each)",
    "torchrl_async_batched": "TorchRL `AsyncBatchedCollector` (**async mode**: a batch need not hold equal steps of "
                             "every env): `N` envs in a multiprocessing `AsyncEnvPool`, `N / W` per process, an "
                             "`InferenceServer` thread batching up to `N` observations",
}
LIMIT_TEXT = ("Limit: this machine's ceiling for the workload as `auturi tune` estimates it "
              "(`auturi.tuner.api.machine_limit`), from the serial config (envs and policy in the caller, no IPC, "
              "measured in the same interleaved rounds) and the tuner's profile: the least of the cores shared by "
              "env stepping and inference (cores / (the env's CPU per step + inference's cheapest CPU per row); "
              "an env's waiting costs no CPU), every env stepping at once (envs / the env's step time), and the "
              "best batched inference throughput. Before c6cbfda (2026-11-23, 19:43 UTC) the limit was cores x the "
              "env's step rate, capped by inference: it ignored that inference takes the same cores, and counted "
              "a waiting env as computing.")


def _rate(x: float) -> str:
    return f"{x:,.0f}"


def _pm(s: dict) -> str:
    return f"±{100 * s['spread']:.0f}%"


def _cell(x: Any) -> str:
    """Text for a markdown table cell (config labels hold ``|``)."""
    if isinstance(x, dict):  # the full settings are in the JSON
        keep = ("num_env_runners", "num_envs_per_env_runner") if "num_env_runners" in x else tuple(x)
        x = ", ".join(f"{k}={v}" for k, v in x.items() if k in keep and k != "task")
    return str(x).replace("|", "\\|")


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


# ---------------------------------------------------------------------------- markdown
def _footer(skipped: dict, img: str | None, alt: str) -> list[str]:
    """What did not run and why, then the section's plot."""
    lines = [f"Not run: {k}: {why}." for k, why in skipped.items()]
    lines += [""] if lines else []
    return lines + ([f"![{alt}]({img})", ""] if img else [])


def collect_md(res: dict, img: str | None) -> list[str]:
    c = res["collect"]
    lines = ["### Collection throughput", "",
             "Env steps per second of one collection sample (the workload's rollout length on all its envs), "
             "median of the interleaved rounds; `±` half the interquartile range, `min..max` the extremes; the last "
             "column is Auturi tuned's median over the row's (above 1: Auturi is faster). Every system runs the "
             "workload's own policy network (`bench/workloads.py`) on the CPU.", ""]
    for row in c["workloads"]:
        lines += [f"**{row['workload']}**: {row['description']}; {row['num_envs']} envs x {row['rows']} steps per "
                  f"sample.", "",
                  "| system | settings | steps/s | ± | min..max | n | Auturi tuned / system |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for k, st in sorted(row["peers"].items(), key=lambda kv: -kv[1]["median"]):
            ratio = "1.00x" if k == "auturi_tuned" else f"{row['auturi_vs'][k]:.2f}x"
            lines.append(f"| {k} | {_cell(row['settings'].get(k, ''))} | {_rate(st['median'])} | {_pm(st)} | "
                         f"{_rate(st['min'])}..{_rate(st['max'])} | {st['n']} | {ratio} |")
        t = row["tuned"]
        lines += ["", f"Tuning: {t['trials']} trials in {t['seconds']:.0f} s; the choice measured "
                      f"{_rate(t['tuned_throughput'])} steps/s there. "
                      + (f"Best peer: {row['best_peer']['name']}, Auturi tuned = "
                         f"{row['best_peer']['auturi_tuned_vs']:.2f}x it." if "best_peer" in row else "")]
        if "fixed" in row:
            lines.append(f"Fixed config: {row['fixed']['source']}.")
        lines += limit_lines(row)
        lines += _footer(row["skipped"], None, "") or [""]
    lines += limit_table(c["workloads"])
    lines += ["Systems:", ""] + [f"- `{k}`: {v}" for k, v in PEER_TEXT.items()] + [""]
    return lines + _footer({f"workload {k}": why for k, why in c["skipped"].items()}, img, "collection throughput")


def limit_lines(row: dict) -> list[str]:
    """One workload's limit and the tuned choice's share of it (none when it was not measured)."""
    lim = row.get("limit") or {}
    if "limit_share" not in row:
        return []
    top = lim["steps_per_second"]
    if top == lim.get("inference_steps_per_second"):
        by = "inference-bound"
    elif top == lim.get("concurrent_steps_per_second"):
        by = "env-bound: every env stepping at once"
    elif "cpu_steps_per_second" in lim:
        by = f"{lim['bound']}-bound: envs and inference sharing {lim['cores']} cores"
    else:  # a record from before the shared-cores limit
        by = f"env-bound: {lim['cores']} cores x {_rate(lim['env_steps_per_second'] / lim['cores'])} steps/s"
    return [f"Limit: {_rate(top)} steps/s ({by}); Auturi tuned reaches **{100 * row['limit_share']:.0f}%** of it."]


def limit_table(rows: list[dict]) -> list[str]:
    """Every workload's tuned throughput as a fraction of this machine's limit (issue 19)."""
    rows = [r for r in rows if "limit_share" in r]
    if not rows:
        return []
    lines = ["**How close to the limit**: " + LIMIT_TEXT, "",
             "| workload | limit steps/s | bound | shared cores | envs alone | inference | Auturi tuned | share of limit |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]

    def cell(x: float | None) -> str:
        return _rate(x) if x else "-"

    for r in rows:
        lim = r["limit"]
        lines.append(f"| {r['workload']} | {_rate(lim['steps_per_second'])} | {lim['bound']} | "
                     f"{cell(lim.get('cpu_steps_per_second'))} | {cell(lim.get('env_steps_per_second'))} | "
                     f"{cell(lim.get('inference_steps_per_second'))} | "
                     f"{_rate(r['peers']['auturi_tuned']['median'])} | {100 * r['limit_share']:.0f}% |")
    return lines + [""]


def e2e_md(res: dict, img: str | None) -> list[str]:
    e = res["e2e"]
    lines = ["### End-to-end PPO `learn`", "",
             "Wall seconds of `PPO(\"MlpPolicy\", n_steps=<rollout length>, batch_size=256).learn(steps)`, torch 1 "
             "thread, runs alternated, median over seeds; speed-up = SB3's seconds / these; return = mean of the "
             "last 50 episodes. `tuned`: `auturi.wrap(model)` (online tuning inside the timed run); `fixed`: "
             "`auturi.wrap(model, config=...)`.", "",
             "| env | envs x steps/rollout | learn steps | SB3 default | wrapped, tuned online | wrapped, fixed | "
             "fixed config |", "|---|---|---:|---:|---:|---:|---|"]
    for cs in e["cases"]:
        cells = []
        for kind in ("sb3", "tuned", "fixed"):
            if kind not in cs:
                cells.append("-")
                continue
            k = cs[kind]
            sp = f", **{k['speedup_vs_sb3']:.2f}x**" if "speedup_vs_sb3" in k else ""
            cells.append(f"{k['median']:.1f} s{sp} (return {k['mean_return']:.0f})")
        fc = cs.get("fixed_config")
        fx = _cell(f"{fc['label']} ({fc['source']})") if fc else "-"
        lines.append(f"| {cs['env_id']} | {cs['n_envs']} x {cs['n_steps']} | {cs['steps']:,} | "
                     + " | ".join(cells) + f" | {fx} |")
    return lines + [""] + _footer(e["skipped"], img, "end-to-end")


def envstep_md(res: dict, img: str | None) -> list[str]:
    from bench.envstep import table

    v = res["envstep"]
    lines = ["### Env-parallel scaling", "",
             f"{v['env']}, constant actions, env steps/s ({v['steps_per_sample']} env steps per sample, "
             f"{v['rounds']} rounds). `auturi_degree_N`: every env in its own stepping context, against "
             "`subproc` and `async_shm`; `auturi_degree_2`: 2 contexts, and `auturi_serial`, against `dummy` "
             "(`bench/envstep.py`).", ""] + table(v["rows"]) + [""]
    return lines + _footer({}, img, "env-parallel scaling")


def actors_md(res: dict, img: str | None) -> list[str]:
    a = res["actors"]
    lines = ["### Actor scaling", "",
             f"Workload `{a['workload']}`, {a['envs_per_actor']} envs per actor, env steps/s: Auturi "
             f"`Config(num_actors=k, envs_per_actor={a['envs_per_actor']})` against RLlib `num_env_runners=k`, "
             f"`num_envs_per_env_runner={a['envs_per_actor']}` (Ray actors), same network.", "",
             "| actors | envs | Auturi | ± | RLlib | ± | Auturi / RLlib |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in a["rows"]:
        rl = r.get("rllib")
        lines.append(f"| {r['actors']} | {r['num_envs']} | {_rate(r['auturi']['median'])} | {_pm(r['auturi'])} | "
                     + (f"{_rate(rl['median'])} | {_pm(rl)} | {r['auturi_vs_rllib']:.2f}x |" if rl else "- | - | - |"))
    return lines + [""] + _footer(a["skipped"], img, "actor scaling")


def targets_md(res: dict) -> list[str]:
    """Issue 7's targets, each as a ratio from this run (met / not met, no judgement)."""
    rows = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    for w in res.get("collect", {}).get("workloads", []):
        if "best_peer" in w:
            r = w["best_peer"]["auturi_tuned_vs"]
            rows.append(f"| Auturi's choice >= the best peer, {w['workload']} | {r:.2f}x {w['best_peer']['name']} | "
                        f"{verdict(r >= 1.0)} |")
    for w in res.get("collect", {}).get("workloads", []):
        if "limit_share" in w and w["limit"].get("bound") == "env":
            x = w["limit_share"]
            rows.append(f"| Auturi's choice >= 80% of the machine's limit (env-bound), {w['workload']} | "
                        f"{100 * x:.0f}% | {verdict(x >= 0.8)} |")
    for r in res.get("envstep", {}).get("rows", []):
        if r["n"] >= 16 and "ratio_degreeN_vs_subproc" in r:
            x = r["ratio_degreeN_vs_subproc"]
            rows.append(f"| degree N >= 5x SubprocVecEnv, N = {r['n']} | {x:.2f}x | {verdict(x >= 5.0)} |")
    for c in res.get("e2e", {}).get("cases", []):
        for kind in ("tuned", "fixed"):
            if kind in c:
                x = c[kind]["speedup_vs_sb3"]
                rows.append(f"| `learn` with auturi.wrap ({kind}) vs SB3 default, {c['env_id']} | {x:.2f}x | "
                            "see note |")
    if not rows:
        return []
    return ["### Targets, as ratios in this run", "",
            "| target | this run | |", "|---|---:|---|"] + rows + [
            "", "End-to-end, the target is faster than SB3 where collection is not serial-optimal and within noise "
                "where it is; the collection table shows which case a workload is. Ratios from a busy machine or a "
                "`--quick` run are not evidence either way.",
            ""]


def markdown(res: dict, images: dict[str, str], source: str = "") -> str:
    """The generated block: a heading with the machine, versions and command, then one
    subsection per section that ran. ``images``: section -> link to its PNG."""
    mins = res.get("seconds", 0) / 60
    la0, la1 = res.get("load_average_start"), res.get("load_average_end")
    lines = ["## Auturi against its peers, one run: `python -m bench`", "",
             f"Generated by `bench/suite.py` from `{source or res['name'] + '.json'}`; do not edit between the "
             f"bench markers (the next `python -m bench --update-docs` replaces it). On 2 cores a full run "
             f"(`python -m bench`) takes about {FULL_MINUTES} minutes and `--quick` about 4.", ""]
    if res.get("note"):
        lines += [res["note"], ""]
    lines += [f"Machine: {res['machine']}  ",
              f"Command: `{res['command']}` ({res['mode']} sizing, {mins:.1f} min, started {res['started']})  ",
              f"Load average (1 min) at start / end: {la0[0]:.2f} / {la1[0]:.2f}; torch threads in the caller: "
              f"{res['torch_threads']}" if la0 and la1 else "", ""]
    for sec, fn in (("collect", collect_md), ("e2e", e2e_md), ("envstep", envstep_md), ("actors", actors_md)):
        if sec in res:
            lines += fn(res, images.get(sec))
    lines += targets_md(res)
    return "\n".join(lines).rstrip("\n") + "\n"


def splice(text: str, block: str) -> str:
    """``text`` with what lies between the bench markers replaced by ``block``."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"the page has no {BEGIN} ... {END} markers: add them where the generated tables go")
    return text[:i + len(BEGIN)] + "\n" + block.strip("\n") + "\n" + text[j:]


# ---------------------------------------------------------------------------- plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_collect(res: dict, path: Path) -> None:
    plt = _plt()
    rows = res["collect"]["workloads"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 0.45 * sum(len(r["peers"]) for r in rows) + 1.2 * len(rows)),
                             squeeze=False)
    for ax, row in zip(axes[:, 0], rows):
        items = sorted(row["peers"].items(), key=lambda kv: kv[1]["median"])
        names = [k for k, _ in items]
        med = [v["median"] for _, v in items]
        err = [[v["median"] - v["min"] for _, v in items], [v["max"] - v["median"] for _, v in items]]
        colors = ["tab:green" if k.startswith("auturi") else "tab:gray" for k in names]
        ax.barh(names, med, xerr=err, color=colors, capsize=3)
        ax.set_title(f"{row['workload']}: {row['num_envs']} envs x {row['rows']} steps", fontsize=10)
        ax.set_xlabel("env steps/s (median, bars min..max)")
    _save(fig, path)


def plot_e2e(res: dict, path: Path) -> None:
    plt = _plt()
    cases = res["e2e"]["cases"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    kinds = [k for k in ("sb3", "tuned", "fixed") if any(k in c for c in cases)]
    width = 0.8 / max(1, len(kinds))
    for i, kind in enumerate(kinds):
        xs = [j + i * width for j, c in enumerate(cases) if kind in c]
        ys = [c[kind]["median"] for c in cases if kind in c]
        ax.bar(xs, ys, width, label={"sb3": "SB3 default", "tuned": "auturi.wrap (tuned online)",
                                     "fixed": "auturi.wrap (fixed config)"}[kind])
    ax.set_xticks([j + width * (len(kinds) - 1) / 2 for j in range(len(cases))])
    ax.set_xticklabels([f"{c['env_id']}\n{c['steps']:,} steps" for c in cases])
    ax.set_ylabel("PPO learn wall seconds (lower is better)")
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _plt().close(fig)


def _line_plot(rows: list[dict], series: Any, xkey: str, path: Path, xlabel: str, ylabel: str,
               log: bool = False) -> None:
    """Median against ``xkey`` for each of ``series`` (bars: min..max)."""
    fig, ax = _plt().subplots(figsize=(7, 4))
    for name in series:
        pts = [(r[xkey], r[name]) for r in rows if name in r]
        if pts:
            ax.errorbar([x for x, _ in pts], [s["median"] for _, s in pts],
                        yerr=[[s["median"] - s["min"] for _, s in pts], [s["max"] - s["median"] for _, s in pts]],
                        marker="o", capsize=3, label=name)
    if log:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    xs = [r[xkey] for r in rows]
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_envstep(res: dict, path: Path) -> None:
    from bench.envstep import COLUMNS

    _line_plot(res["envstep"]["rows"], COLUMNS, "n", path, "envs N", "env steps/s (CartPole, constant actions)",
               log=True)


def plot_actors(res: dict, path: Path) -> None:
    _line_plot(res["actors"]["rows"], ("auturi", "rllib"), "actors", path,
               "actors (Auturi num_actors / RLlib num_env_runners)", f"env steps/s ({res['actors']['workload']})")


PLOTS = {"collect": plot_collect, "e2e": plot_e2e, "envstep": plot_envstep, "actors": plot_actors}


def write(res: dict, out_dir: Path, docs: Path | None) -> dict[str, Any]:
    """Write ``<out_dir>/<name>.json``, the PNGs (``docs/img/`` next to ``docs``, else
    ``out_dir``), ``<out_dir>/<name>.md``, and splice the block into ``docs`` when given."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    img_dir = docs.parent / "img" if docs is not None else out_dir
    img_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = {"json": out_dir / f"{res['name']}.json"}
    paths["json"].write_text(json.dumps(res, indent=1, default=str))
    pngs: dict[str, Path] = {}
    for sec, fn in PLOTS.items():
        if sec in res:
            pngs[sec] = img_dir / f"{res['name']}_{sec}.png"
            fn(res, pngs[sec])
            paths[f"png_{sec}"] = pngs[sec]
    md_path = out_dir / f"{res['name']}.md"
    try:
        source = str(paths["json"].resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        source = paths["json"].name
    md_path.write_text(markdown(res, {k: _rel(p, out_dir) for k, p in pngs.items()}, source))
    paths["markdown"] = md_path
    if docs is not None:
        block = markdown(res, {k: _rel(p, docs.parent) for k, p in pngs.items()}, source)
        # bytes in, bytes out: everything outside the markers stays exactly as it was
        docs.write_bytes(splice(docs.read_bytes().decode("utf-8"), block).encode("utf-8"))
        paths["docs"] = docs
        paths["markdown_text"] = block
    else:
        paths["markdown_text"] = md_path.read_text()
    return paths
