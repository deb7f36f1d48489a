"""The ``auturi`` command line.

Still one module (over 500 lines): policy building, model loading, knob parsing and the
tables are split by role together with the status server, when both are reworked.

``auturi tune ENV`` measures layouts for ENV on this machine and prints the fastest;
``auturi show result.json`` prints a saved result again; ``auturi bench ...`` runs the
benchmark suite of a source checkout (``python -m bench``). See ``docs/cli.md``.

Exit codes: 0 done, 1 tuning failed at run time (a worker died), 2 bad input (unknown env,
bad budget, missing GPU, unreadable file; one line says what to change), 130 interrupted.

Workers start with ``forkserver``, which imports the main module again: this module does
nothing at import but define the commands, and runs them only under ``__main__``.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["CliError", "app", "build_policy", "config_line", "main", "resolve_env_spec"]

# Defaults sized so that `auturi tune CartPole-v1` ends in well under a minute on 2 cores.
DEFAULT_NUM_ENVS = 8
DEFAULT_NUM_STEPS = 64
DEFAULT_BUDGET_SECONDS = 15.0
DEFAULT_MAX_TRIAL_SECONDS = 4.0
DEFAULT_TOP_K = 2
DEFAULT_FINAL_ROUNDS = (1, 2)

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class CliError(Exception):
    """A user-facing error: one line naming the fix; exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


class Strategy(str, Enum):
    model = "model"
    grid = "grid"
    optuna = "optuna"


class Backend(str, Enum):
    shm = "shm"
    serial = "serial"
    ray = "ray"


app = typer.Typer(
    name="auturi", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Find, by measurement, the fastest parallel layout for RL experience collection.")


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _stdout() -> Console:
    c = Console(highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = 160  # piped: do not fold config labels at 80 columns
    return c


def _one_line(msg: str, max_lines: int = 3) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return "; ".join(lines[:max_lines]) if lines else "unknown error"


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    raise CliError(message, code)


# ---------------------------------------------------------------------------- env and policy
def resolve_env_spec(spec: str) -> Any:
    """What ``make_executor`` takes for the ENV argument: a gymnasium id, an EnvPool id
    (``envpool:Pong-v5``), or ``module:factory`` (a callable returning a ``gymnasium.Env``;
    gymnasium's own ``module:Env-v0`` spelling, which imports the module to register the id,
    works too)."""
    from auturi.envs import ENVPOOL_PREFIX

    spec = spec.strip()
    if not spec:
        _fail("ENV is empty: pass a gymnasium id (CartPole-v1), envpool:TASK or module:factory")
    if spec.startswith(ENVPOOL_PREFIX):
        if importlib.util.find_spec("envpool") is None:
            _fail(f"{spec} needs EnvPool, which is not installed: pip install envpool (or 'auturi[envpool]')")
        return spec
    if ":" not in spec:
        return spec
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        _fail(f"ENV {spec!r}: write module:factory, e.g. my_envs:make_env")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the user's files import
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        _fail(f"ENV {spec!r}: cannot import module {module_name!r} ({e}); check the name and that it is on "
              f"PYTHONPATH or in the current directory")
    except Exception as e:  # noqa: BLE001 - the user's module raised while importing
        _fail(f"ENV {spec!r}: importing {module_name!r} raised {type(e).__name__}: {_one_line(str(e))}")
    obj: Any = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        import gymnasium as gym

        if attr in gym.registry:  # gymnasium's "module:Env-v0": importing the module registered it
            return attr
        _fail(f"ENV {spec!r}: module {module_name!r} has no attribute {attr!r} (and no gymnasium id {attr!r} "
              f"was registered by importing it)")
    if not callable(obj):
        _fail(f"ENV {spec!r}: {attr} is a {type(obj).__name__}, not a callable returning a gymnasium.Env")
    return obj


def _probe_spaces(env: Any) -> tuple[Any, Any]:
    """Observation and action space of one env of ``env`` (made and closed here)."""
    from auturi.envs import resolve_env_fns

    try:
        fn = resolve_env_fns(env, 1)[0]
    except (ValueError, TypeError) as e:
        msg = _one_line(str(e))
        if msg.startswith("unknown gymnasium env id"):
            msg = msg.split(" Register it")[0] + (" Check the spelling, or pass ENV as module:factory (a callable "
                                                  "returning a gymnasium.Env), or envpool:TASK.")
        elif msg.startswith("unknown EnvPool task id"):
            msg += " List them with: python -c 'import envpool; print(envpool.list_all_envs())'"
        _fail(msg)
    try:
        e = fn()
    except Exception as exc:  # noqa: BLE001 - the user's factory
        _fail(f"making the env failed: {type(exc).__name__}: {_one_line(str(exc))}")
    try:
        import gymnasium as gym

        if not isinstance(e, gym.Env):
            _fail(f"the env factory returned a {type(e).__name__}, not a gymnasium.Env")
        return e.observation_space, e.action_space
    finally:
        try:
            e.close()
        except Exception:  # noqa: BLE001, S110
            pass


def build_policy(kind: str, obs_space: Any, action_space: Any) -> tuple[Any, str]:
    """The policy for ``--policy``: ``auto`` (``cnn`` for image observations, else ``mlp``),
    ``mlp``, ``cnn`` or a saved SB3 model (``PATH.zip``). Returns it and a description."""
    import functools

    import gymnasium as gym
    import numpy as np

    kind = kind.strip()
    if kind.lower().endswith(".zip") or os.sep in kind:
        return _sb3_policy(Path(kind).expanduser(), obs_space, action_space), f"sb3:{Path(kind).name}"
    kind = kind.lower()
    if kind not in ("auto", "mlp", "cnn"):
        _fail(f"--policy {kind!r}: use mlp, cnn, auto or the path of a saved SB3 model (model.zip)")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        _fail(f"the built-in policies support Discrete and Box action spaces, not {action_space}; pass --policy "
              f"PATH.zip with a saved SB3 model")
    if not isinstance(obs_space, gym.spaces.Box):
        _fail(f"the built-in policies need a Box observation space, not {type(obs_space).__name__}; pass --policy "
              f"PATH.zip with a saved SB3 model")
    image = len(obs_space.shape) == 3 and obs_space.shape[1:] == (84, 84)
    if kind == "auto":
        kind = "cnn" if image and isinstance(action_space, gym.spaces.Discrete) else "mlp"
    if kind == "cnn":
        if not image:
            _fail(f"--policy cnn needs channels-first 84x84 frames (C, 84, 84); this env gives {obs_space.shape}: "
                  f"use --policy mlp")
        if not isinstance(action_space, gym.spaces.Discrete):
            _fail("--policy cnn needs a Discrete action space; use --policy mlp")
    from auturi.nets import (  # imports torch: after the checks
        MLPActorCritic,
        NatureCNNActorCritic,
    )
    from auturi.policy import TorchPolicy

    if kind == "cnn":
        fn = functools.partial(NatureCNNActorCritic, int(obs_space.shape[0]), int(action_space.n))
        return TorchPolicy(fn, action_space), "cnn (Nature CNN)"
    obs_dim = int(np.prod(obs_space.shape))
    if isinstance(action_space, gym.spaces.Discrete):
        fn = functools.partial(MLPActorCritic, obs_dim, int(action_space.n))
    else:
        fn = functools.partial(MLPActorCritic, obs_dim, int(np.prod(action_space.shape)), continuous=True)
    return TorchPolicy(fn, action_space), "mlp (64x64)"


def _sb3_policy(path: Path, obs_space: Any, action_space: Any) -> Any:
    """The policy network of a saved SB3 on-policy model, as an auturi policy."""
    if not path.is_file():
        _fail(f"--policy {path}: no such file; pass mlp, cnn, or the path of a model saved with model.save()")
    if importlib.util.find_spec("stable_baselines3") is None:
        _fail("--policy PATH.zip needs stable-baselines3: pip install stable-baselines3 (or 'auturi[sb3]')")
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.save_util import load_from_zip_file

    from auturi.adapters.sb3 import _DISTRIBUTIONS, SB3PolicyAdapter

    try:
        data, params, _ = load_from_zip_file(path, device="cpu", print_system_info=False)
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign zip
        _fail(f"--policy {path}: not a readable SB3 model ({type(e).__name__}: {_one_line(str(e))})")
    if not data or "policy_class" not in data or not params or "policy" not in params:
        _fail(f"--policy {path}: the file holds no SB3 policy (saved with model.save()?)")
    policy_class = data["policy_class"]
    if not (isinstance(policy_class, type) and issubclass(policy_class, ActorCriticPolicy)):
        _fail(f"--policy {path}: {getattr(policy_class, '__name__', policy_class)} is not an on-policy "
              f"ActorCriticPolicy (PPO, A2C); off-policy models are not supported")
    m_obs, m_act = data.get("observation_space"), data.get("action_space")
    if m_obs is None or m_act is None:
        _fail(f"--policy {path}: the model does not record its spaces; re-save it with a current SB3")
    if getattr(m_obs, "shape", None) != getattr(obs_space, "shape", None) or m_act != action_space:
        _fail(f"--policy {path}: the model expects observations {m_obs} and actions {m_act} but the env gives "
              f"{obs_space} and {action_space}; pass ENV as module:factory building the env as the model saw it "
              f"(frame stacking, transposition)")
    if data.get("use_sde"):
        _fail(f"--policy {path}: gSDE policies (use_sde=True) are not supported")
    kwargs = dict(data.get("policy_kwargs") or {})
    kwargs["use_sde"] = False
    net = policy_class(m_obs, m_act, lambda _: 0.0, **kwargs)
    net.load_state_dict(params["policy"])
    dist = type(net.action_dist).__name__
    if dist not in _DISTRIBUTIONS:
        _fail(f"--policy {path}: action distribution {dist} is not supported (use {sorted(_DISTRIBUTIONS)})")
    adapter = SB3PolicyAdapter(policy_class, m_obs, m_act, kwargs, dist)
    adapter.load_state({k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
    return adapter


def _parse_start(text: str, num_envs: int) -> Any:
    """``--start num_actors=2,env_parallel_degree=2`` as a Config for ``num_envs`` envs
    (``envs_per_actor`` follows from ``num_actors`` unless given)."""
    from auturi.config import Config
    from auturi.errors import ConfigError

    names = Config.knob_names()
    knobs: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in names:
            _fail(f"--start {text!r}: {part!r} is not KNOB=VALUE with KNOB one of {', '.join(names)}")
        if key == "policy_device":
            knobs[key] = value
            continue
        try:
            knobs[key] = int(value)
        except ValueError:
            _fail(f"--start: {key}={value!r} must be an integer")
    actors = knobs.get("num_actors", 1)
    if isinstance(actors, int) and actors >= 1 and "envs_per_actor" not in knobs:
        if num_envs % actors:
            _fail(f"--start: num_actors={actors} must divide --num-envs {num_envs}")
        knobs["envs_per_actor"] = num_envs // actors
    try:
        config = Config(**knobs)
    except ConfigError as e:
        _fail(f"--start: {e}")
    if config.num_envs != num_envs:
        _fail(f"--start: num_actors*envs_per_actor = {config.num_envs} but --num-envs is {num_envs}")
    return config


def _parse_devices(devices: str | None, label: str | None = None) -> list[str] | None:
    if devices is None:
        return None
    label = label or f"--devices {devices}"
    out = [d.strip().lower() for d in devices.split(",") if d.strip()]
    if not out:
        _fail("--devices is empty: pass cpu, cuda or cpu,cuda")
    for d in out:
        if not _DEVICE_RE.match(d):
            _fail(f"--devices: {d!r} is not a device; use cpu, cuda or cuda:K, comma-separated")
    if any(d != "cpu" for d in out):
        import torch

        from auturi.errors import ConfigError
        from auturi.executor.base import check_device

        if not torch.cuda.is_available():
            _fail(f"{label}: no CUDA device here (torch.cuda.is_available() is False); use cpu "
                  f"(--devices cpu), or install a CUDA build of torch on a GPU machine")
        for d in out:
            try:
                check_device(d)
            except ConfigError as e:
                _fail(f"{label}: {e.rule}; use cuda (or an existing cuda:K) or cpu")
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------- output
def config_line(config: Any) -> str:
    """The choice as a line of Python: ``auturi.Config(num_actors=..., ...)``."""
    args = ", ".join(f"{k}={v!r}" for k, v in config.to_dict().items())
    return f"auturi.Config({args})"


def _fmt(x: Any, digits: int = 0) -> str:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return f"{x:,.{digits}f}"


NOTES = {
    "converged": "both ends of its interval came within 5% of its median",
    "slower": "stopped early: its interval lay wholly below the best config's",
    "max_samples": "stopped at the most samples a trial takes",
    "max_seconds": "stopped at --max-trial-seconds",
    "budget": "stopped when the budget ran out",
    "separated": "re-measure stopped: the fastest one's interval lay above all the others'",
    "max_rounds": "re-measure ran its most rounds",
    "confirm": "re-measured after the choice was made, with start and serial, in fixed interleaved rounds",
}
"""What each word of the table's note column means (the footer and --help print these)."""
SOURCES = {
    "start": "your --start layout (serial when not given)", "serial": "one actor, one env lane, one policy",
    "cache": "the choice cached from an earlier run", "search": "proposed by the strategy",
    "final": "re-measured interleaved to choose between close ones",
    "confirm": "re-measured after the choice: the numbers printed below the table",
}
INTERVAL_HELP = ("steps/s is the median of the n samples (steps per second of one collect); interval is the "
                 "distribution-free interval of the median with its exact confidence: the samples' range below 6 "
                 "samples (75% at 3, 88% at 4, 94% at 5), >= 95% from 6; none below 3 samples")


def notes_help() -> str:
    """The note words, sources and interval, as the help text and the table footer say them."""
    return ("Notes: " + "; ".join(f"{k}: {v}" for k, v in NOTES.items()) + ". Sources: "
            + "; ".join(f"{k}: {v}" for k, v in SOURCES.items()) + ". " + INTERVAL_HELP + ".")


def trials_title(result: Any) -> str:
    """The table's title: the same counts as the "why" line (:meth:`TuneResult.counts`)."""
    k = result.counts()
    space = f" of {k['space']}" if k.get("space") is not None else ""
    return (f"Trials: {k['measured']} measured ({k['baselines']} baselines + {k['searched']} searched{space}), "
            f"{k['decided']} re-measured to choose, {k['confirmed']} confirmed; * = the choice's row, whose "
            f"numbers are printed below")


def trials_table(result: Any, title: str | None = None) -> Table:
    """The trials of a :class:`~auturi.tuner.TuneResult` as a rich table, in
    :meth:`~auturi.tuner.TuneResult.rows` order (the starred row, whose numbers the choice
    line prints, on top); the footer explains every note word and source it shows."""
    rows = result.rows()
    has_pred = any(t.predicted is not None for t in rows)
    table = Table(title=title, show_lines=False, header_style="bold", title_justify="left",
                  caption_justify="left")
    table.add_column("steps/s", justify="right")
    table.add_column("interval", justify="right")
    table.add_column("n", justify="right")
    if has_pred:
        table.add_column("predicted", justify="right")
    table.add_column("source")
    table.add_column("config", overflow="fold")
    table.add_column("note", overflow="fold")
    starred = result.choice_trial
    for t in rows:
        note = t.stop_reason or ""
        if not t.ok:
            note = f"{t.status}: {_one_line(t.error or '')}"
        mark = " *" if t is starred else ""
        cells = [_fmt(t.estimate) if t.ok else t.status, t.interval_text() if t.ok else "", str(t.n)]
        if has_pred:
            cells.append(_fmt(t.predicted))
        cells += [t.source, f"{t.config}{mark}", note]
        table.add_row(*cells, style="bold green" if mark else None)
    words = [w for w in NOTES if any(t.stop_reason == w for t in rows)]
    sources = [s for s in SOURCES if any(t.source == s for t in rows)]
    table.caption = "; ".join([f"{w}: {NOTES[w]}" for w in words] + [f"{s}: {SOURCES[s]}" for s in sources]
                              + [INTERVAL_HELP])
    return table


def print_result(console: Console, result: Any, saved: Path | None = None) -> None:
    console.print(trials_table(result, title=trials_title(result)))
    sp_start, sp_serial = result.speedup("start"), result.speedup("serial")
    ct = result.choice_trial
    iv = ct.interval_text() if ct is not None else ""
    head = f"  {_fmt(result.throughput)} steps/s" + (f", interval {iv}" if iv else "") + \
        (f", median of {ct.n} ({ct.source})" if ct is not None else "")
    console.print(f"[bold]Choice:[/bold] {result.choice}")
    console.print(head + (f"; {sp_serial:.2f}x serial" if math.isfinite(sp_serial) else ""), highlight=False,
                  markup=False, soft_wrap=True)
    if math.isfinite(sp_start) and result.start != type(result.choice).serial(result.choice.num_envs):
        console.print(f"  {sp_start:.2f}x the start config ({result.start})", markup=False, soft_wrap=True)
    if result.reason:
        console.print(f"  why: {result.reason}", soft_wrap=True, markup=False)
    console.print(config_line(result.choice), soft_wrap=True, markup=False)
    if saved is not None:
        console.print(f"Saved: {saved}  (auturi show {saved})", soft_wrap=True, markup=False)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


# ---------------------------------------------------------------------------- progress
class _ProgressFeed:
    """The tuner callback: drives a rich progress bar and the status snapshot."""

    def __init__(self, progress: Any, snapshot: Any):
        self.progress, self.snapshot = progress, snapshot
        self.task = progress.add_task("starting", total=1000, best="-") if progress is not None else None

    def __call__(self, event: Any) -> None:
        try:
            if self.snapshot is not None:
                self.snapshot(event)
            if self.progress is not None:
                self._draw(event)
        except Exception:  # noqa: BLE001, S110 - a display problem must never stop tuning
            pass

    def _draw(self, event: Any) -> None:
        s = event.status
        fr = 0.0
        if s.get("budget_trials"):
            fr = max(fr, 1 - (s.get("budget_trials_left") or 0) / s["budget_trials"])
        if s.get("budget_seconds"):
            fr = max(fr, 1 - (s.get("budget_seconds_left") or 0) / s["budget_seconds"])
        phase = s.get("phase", "")
        if phase in ("final", "done"):
            fr = 1.0
        from auturi.config import Config

        cur = s.get("current_config")
        if phase == "final":
            t = getattr(event, "trial", None)
            desc = f"{phase:<9} re-measuring  {t.config if t is not None else ''}"
        else:
            what = str(Config.from_dict(cur)) if cur else ""
            desc = f"{phase:<9} trial {s.get('trials', 0) + (1 if cur else 0):>2}  {what}"
        best = s.get("best_throughput")
        self.progress.update(self.task, completed=int(1000 * min(1.0, fr)), description=desc,
                             best=f"best {_fmt(best)} steps/s" if best else "best -")


def _make_progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), console=console, transient=True)


# ---------------------------------------------------------------------------- commands
Opt = typer.Option


@app.command(epilog=notes_help())
def tune(
    env: Annotated[str, typer.Argument(help="A gymnasium id (CartPole-v1), an EnvPool id (envpool:Pong-v5), or "
                                            "module:factory (a callable returning a gymnasium.Env).")],
    policy: Annotated[str, Opt("--policy", help="mlp, cnn, auto (cnn for 84x84 frames, else mlp), or PATH.zip: "
                                                "a saved SB3 PPO/A2C model's network.")] = "auto",
    num_envs: Annotated[int, Opt("--num-envs", help="Total envs (kept fixed by the search).")] = DEFAULT_NUM_ENVS,
    num_steps: Annotated[int, Opt("--num-steps", help="Steps per env per collect (your training's rollout "
                                                      "length).")] = DEFAULT_NUM_STEPS,
    strategy: Annotated[Strategy, Opt("--strategy", help="model (profile, predict, measure the promising), grid "
                                                         "(all), optuna.")] = Strategy.model,
    budget_trials: Annotated[int | None, Opt("--budget-trials", help="Most configs to measure (baselines "
                                                                     "included).")] = None,
    budget_seconds: Annotated[float | None, Opt("--budget-seconds", help=f"Wall seconds for the tuning, final "
                                                f"re-measure included (default {DEFAULT_BUDGET_SECONDS:g} when no "
                                                f"budget is given).")] = None,
    devices: Annotated[str | None, Opt("--devices", help="Policy devices to consider: cpu, cuda, cpu,cuda "
                                                         "(default: cpu, plus cuda when present).")] = None,
    start: Annotated[str | None, Opt("--start", help="Your current layout, measured as a baseline, e.g. "
                                                     "num_actors=2,env_parallel_degree=2 (default: serial).")] = None,
    seed: Annotated[int, Opt("--seed", help="Seeds the envs (env i gets seed+i) and the strategy.")] = 0,
    out: Annotated[Path | None, Opt("--out", "-o", help="Write the JSON results record here.")] = None,
    status_port: Annotated[int | None, Opt("--status-port", help="Serve the status page and API on this port "
                                                                 "while tuning (0: any free port).")] = None,
    status_host: Annotated[str, Opt("--status-host", help="Address of the status server; a non-loopback one "
                                                          "needs --status-token.")] = "127.0.0.1",
    status_token: Annotated[str | None, Opt("--status-token", envvar="AUTURI_STATUS_TOKEN",
                                            help="Token the status server requires (Bearer header or "
                                                 "?token=).")] = None,
    status_linger: Annotated[float, Opt("--status-linger", help="Keep serving this many seconds after tuning "
                                                                "ends.")] = 0.0,
    json_out: Annotated[bool, Opt("--json", help="Print only the JSON record on stdout.")] = False,
    backend: Annotated[Backend, Opt("--backend", help="shm (processes, shared memory), serial (everything in "
                                                      "this process) or ray (one Ray actor per actor; see "
                                                      "--address).")] = Backend.shm,
    address: Annotated[str | None, Opt("--address", help="The Ray cluster for --backend ray: auto, HOST:6379 or "
                                                         "ray://HOST:10001 (default: $RAY_ADDRESS, else a local "
                                                         "Ray started for the run).")] = None,
    worker_timeout: Annotated[float | None, Opt("--worker-timeout", metavar="SECONDS",
                                                help="A worker that makes no progress this long fails the trial, "
                                                     "named (default: $AUTURI_WORKER_TIMEOUT, else 60; inf: "
                                                     "never).")] = None,
    max_trial_seconds: Annotated[float, Opt("--max-trial-seconds", help="Cap on one trial's measuring "
                                                                        "time.")] = DEFAULT_MAX_TRIAL_SECONDS,
    cache: Annotated[bool, Opt("--cache/--no-cache", help="Start from, and store into, the results cache "
                                                          "($AUTURI_CACHE_DIR or ~/.cache/auturi).")] = True,
    debug: Annotated[bool, Opt("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Measure collection layouts for ENV on this machine and print the fastest."""
    _run(lambda: _tune(env=env, policy=policy, num_envs=num_envs, num_steps=num_steps, strategy=strategy.value,
                       budget_trials=budget_trials, budget_seconds=budget_seconds, devices=devices, start=start,
                       seed=seed, out=out, status_port=status_port, status_host=status_host, status_token=status_token,
                       status_linger=status_linger, json_out=json_out, backend=backend.value,
                       max_trial_seconds=max_trial_seconds, cache=cache,
                       executor_kwargs=_executor_kwargs(backend.value, address, worker_timeout)), debug)


@app.command()
def show(
    path: Annotated[Path, typer.Argument(help="A results record (auturi tune --out, or a cache file).")],
    json_out: Annotated[bool, Opt("--json", help="Print the choice as JSON.")] = False,
    debug: Annotated[bool, Opt("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Print a saved result: the trials table and the choice as an auturi.Config(...) line."""
    _run(lambda: _show(path, json_out), debug)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                "help_option_names": []})
def bench(ctx: typer.Context) -> None:
    """Run the benchmark suite of a source checkout (python -m bench); see auturi bench --help."""
    _run(lambda: _bench(list(ctx.args)), debug=True)  # a benchmark crash shows its traceback


def _bench(args: list[str]) -> None:
    """Forward to ``bench.suite.main``: the repository's ``bench`` package, importable from the
    current directory or from the checkout this ``auturi`` package lives in (editable install)."""
    root = Path(__file__).resolve().parent.parent
    if (root / "bench" / "suite.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        suite = importlib.import_module("bench.suite")
    except ImportError:
        suite = None
    if suite is None or not callable(getattr(suite, "main", None)):
        _fail("auturi bench needs a source checkout: the benchmarks are the repository's bench/ package, which "
              "pip does not install. Clone the Auturi repository, pip install -e '.[dev]' there, and run "
              "auturi bench (or python -m bench) from its root")
    suite.main(args)


def _run(fn: Callable[[], None], debug: bool) -> None:
    err = _stderr()
    try:
        fn()
    except CliError as e:
        err.print(f"auturi: error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(e.code) from None
    except KeyboardInterrupt:
        err.print("auturi: interrupted; every worker was stopped", markup=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - no traceback for users unless --debug
        if debug:
            traceback.print_exc()
        from auturi.errors import WorkerError

        hint = "" if debug else " (run with --debug for the traceback)"
        if isinstance(e, WorkerError) or type(e).__name__ == "TuneError":
            hint += "; to find which layout fails, try --backend serial or --strategy grid"
        err.print(f"auturi: error: {type(e).__name__}: {_one_line(str(e), 2)}{hint}", markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None


def _executor_kwargs(backend: str, address: str | None, worker_timeout: float | None) -> dict[str, Any]:
    """make_executor's keywords from --address and --worker-timeout, checked before any heavy
    import: a typo or a missing Ray should cost nothing."""
    if address is not None and backend != "ray":
        _fail(f"--address {address} is for --backend ray (the Ray cluster to run on); got --backend {backend}")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        _fail('--backend ray needs Ray, which is not installed: pip install "auturi[ray]"')
    if worker_timeout is not None and not worker_timeout > 0:
        _fail(f"--worker-timeout must be a number of seconds > 0 (inf: never), got {worker_timeout:g}")
    kwargs: dict[str, Any] = {} if worker_timeout is None else {"worker_timeout": worker_timeout}
    if backend == "ray":
        kwargs["address"] = address
    return kwargs


def _tune(*, env: str, policy: str, num_envs: int, num_steps: int, strategy: str, budget_trials: int | None,
          budget_seconds: float | None, devices: str | None, start: str | None, seed: int, out: Path | None,
          status_port: int | None, status_host: str, status_token: str | None, status_linger: float,
          json_out: bool, backend: str, max_trial_seconds: float, cache: bool,
          executor_kwargs: dict[str, Any]) -> None:
    # -- cheap checks first: a typo should not cost a torch import
    if num_envs < 1:
        _fail(f"--num-envs must be >= 1, got {num_envs}")
    if num_steps < 1:
        _fail(f"--num-steps must be >= 1, got {num_steps}")
    if budget_trials is not None and budget_trials < 1:
        _fail(f"--budget-trials must be >= 1, got {budget_trials} (leave it out for the strategy's own stop)")
    if budget_seconds is not None and not (budget_seconds > 0 and math.isfinite(budget_seconds)):
        _fail(f"--budget-seconds must be > 0, got {budget_seconds:g}")
    if not (max_trial_seconds > 0 and math.isfinite(max_trial_seconds)):
        _fail(f"--max-trial-seconds must be > 0, got {max_trial_seconds:g}")
    if status_port is not None and not 0 <= status_port <= 65535:
        _fail(f"--status-port must be in 0..65535 (0: any free port), got {status_port}")
    if status_linger < 0:
        _fail(f"--status-linger must be >= 0, got {status_linger:g}")
    if strategy == "optuna" and importlib.util.find_spec("optuna") is None:
        _fail("--strategy optuna needs Optuna: pip install optuna (or 'auturi[tune]'), or use --strategy model")
    if status_port is not None and importlib.util.find_spec("fastapi") is None:
        _fail("--status-port needs FastAPI and uvicorn: pip install 'auturi[server]'")
    if budget_trials is None and budget_seconds is None:
        budget_seconds = DEFAULT_BUDGET_SECONDS
    if status_port is not None:
        from auturi.server import is_loopback

        if not is_loopback(status_host) and not status_token:
            _fail(f"--status-host {status_host} is not loopback: pass --status-token TOKEN (or set "
                  f"AUTURI_STATUS_TOKEN) so only you can read it, or leave --status-host at 127.0.0.1")
    forks = backend == "shm" and os.environ.get("AUTURI_START_METHOD", "forkserver") == "forkserver"
    early_torch = not (policy.strip().lower().endswith(".zip") or os.sep in policy)  # built-ins: torch, no extras
    if forks:
        # The workers' forkservers import gymnasium and torch on the other core while this
        # process imports its own, probes the env and builds the policy (start-up, not tuning).
        from auturi.executor.shm.forkservers import start_servers

        start_servers(torch=early_torch)
    start_config = _parse_start(start, num_envs) if start is not None else None
    env_obj = resolve_env_spec(env)
    dev_list = _parse_devices(devices)
    if start_config is not None and start_config.policy_device != "cpu":
        dev = start_config.policy_device
        _parse_devices(dev, f"--start policy_device={dev}")  # the same check for a missing GPU
    out_path = out.expanduser() if out is not None else None
    if out_path is not None and out_path.parent and not out_path.parent.exists():
        _fail(f"--out {out}: directory {out_path.parent} does not exist")
    obs_space, act_space = _probe_spaces(env_obj)
    pol, pol_desc = build_policy(policy, obs_space, act_space)

    from auturi.errors import ConfigError
    from auturi.executor import make_executor
    from auturi.tuner import Tuner

    err = _stderr()
    out_console = _stdout()
    progress = None if json_out else _make_progress(err)
    snapshot = server = None
    if status_port is not None:
        from auturi.server import StatusServer, StatusSnapshot

        snapshot = StatusSnapshot()
    feed = _ProgressFeed(progress, snapshot)
    try:
        tuner = Tuner(strategy, budget_trials=budget_trials, budget_seconds=budget_seconds,
                      max_trial_seconds=max_trial_seconds, top_k=DEFAULT_TOP_K, final_rounds=DEFAULT_FINAL_ROUNDS,
                      devices=dev_list, cache=None if cache else False, callback=feed, seed=seed)
    except (ValueError, ImportError) as e:
        _fail(_one_line(str(e)))
    if snapshot is not None:
        snapshot.attach(tuner)
    if not json_out:
        err.print(f"Tuning {env} x {num_envs} envs, {num_steps} steps/collect, policy {pol_desc}, "
                  f"backend {backend}, strategy {strategy}, budget "
                  + ", ".join(x for x in (f"{budget_trials} trials" if budget_trials else "",
                                          f"{budget_seconds:g} s" if budget_seconds else "") if x),
                  markup=False, soft_wrap=True)
    try:
        with make_executor(env_obj, pol, num_envs, start_config, backend=backend, seed=seed,
                           **executor_kwargs) as ex:
            if snapshot is not None:
                assert status_port is not None
                server = StatusServer(snapshot, host=status_host, port=status_port, token=status_token or None,
                                      hardware=None)
                try:
                    url = server.start()
                except Exception as e:  # noqa: BLE001 - ServerError: port in use, ...
                    server = None
                    _fail(_one_line(str(e)))
                err.print(f"Status: {url}" + ("  (token required)" if status_token else ""), markup=False)
            if forks:  # no forkserver import may share the cores with the first measurement
                from auturi.executor.shm.forkservers import wait_ready

                wait_ready(torch=early_torch)
            tuner.startup_seconds = _process_seconds()
            if progress is not None:
                progress.start()
            try:
                result = tuner.tune(ex, num_steps)
            finally:
                if progress is not None:
                    progress.stop()
            if snapshot is not None:
                snapshot.update(status=tuner.status(), trials=tuner.trials())
        saved = result.save(out_path) if out_path is not None else None
        if json_out:
            rec = result.to_record()
            if server is not None:
                rec["status_url"] = server.url
            out_console.file.write(json.dumps(_json_safe(rec), indent=1, allow_nan=False) + "\n")
            out_console.file.flush()
        else:
            print_result(out_console, result, saved)
            if saved is None and cache:
                from auturi.tuner.cache import ResultsCache

                p = ResultsCache().path(result.hardware, result.workload)
                if p.exists():
                    err.print(f"Record cached at {p} (write one with --out result.json)", markup=False,
                              soft_wrap=True)
        if server is not None and status_linger > 0:
            if not json_out:
                err.print(f"Serving {server.url} for {status_linger:g} more s (Ctrl-C to stop)", markup=False)
            try:
                time.sleep(status_linger)
            except KeyboardInterrupt:
                pass  # tuning is done: Ctrl-C only ends the linger
    except ConfigError as e:
        _fail(str(e))
    finally:
        if server is not None:
            server.stop()


def _process_seconds() -> float | None:
    """Seconds since this process started (Linux; None elsewhere): the start-up cost."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(after_name[19])  # field 22, starttime, in clock ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _show(path: Path, json_out: bool) -> None:
    from auturi.tuner import TuneResult

    p = path.expanduser()
    if not p.is_file():
        _fail(f"{path}: no such file; write one with auturi tune ENV --out {path}")
    try:
        result = TuneResult.load(p)
    except json.JSONDecodeError as e:
        _fail(f"{path}: not JSON ({e.msg} at line {e.lineno}); pass a file written by auturi tune --out")
    except (KeyError, TypeError, ValueError) as e:
        _fail(f"{path}: not an Auturi results record ({type(e).__name__}: {_one_line(str(e))}); pass a file "
              f"written by auturi tune --out")
    except OSError as e:
        _fail(f"{path}: cannot read it ({e.strerror})")
    out = _stdout()
    if json_out:
        rec = {"choice": result.choice.to_dict(), "config_line": config_line(result.choice),
               "throughput": result.throughput, "why": result.reason}
        out.file.write(json.dumps(_json_safe(rec), indent=1) + "\n")
        return
    wl = result.workload or {}
    hw = result.hardware or {}
    out.print(f"{p}: {wl.get('env', '?')} x {wl.get('num_envs', '?')} envs, {result.num_steps} steps/collect, "
              f"on {hw.get('cpu_model', '?')} ({hw.get('cores', '?')} cores"
              + (f", {', '.join(hw['gpus'])}" if hw.get("gpus") else "") + ")", markup=False, soft_wrap=True)
    print_result(out, result)


def main(argv: list[str] | None = None) -> None:
    """The console script ``auturi``. Usage errors (a bad option value, a missing argument)
    are one line on stderr and exit 2, like every other input error."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="auturi", standalone_mode=False)
    except Exception as e:
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
            raise
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())
            sys.exit(EXIT_USAGE)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        _stderr().print(f"auturi: error: {_one_line(e.format_message())}{where}", markup=False, soft_wrap=True)
        sys.exit(e.exit_code if isinstance(e.exit_code, int) and e.exit_code else EXIT_USAGE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
