"""Results records, the fingerprints that key them, and the cache of past choices.

Over 400 lines on purpose: reading, checking and storing records share the fingerprints
and the trust rules (owner, atomic writes, one warning per directory); split, each half would
need the other's.

A record is one JSON document per tuning run: the hardware fingerprint (CPU model, cores,
memory, GPUs, torch version), the workload fingerprint (env, spaces, num_envs, policy,
num_steps), every trial with all its samples, and the choice with the reason. The CLI, the
status endpoint and the cache all read the same document.
Reading one checks it (:func:`check_record`): a field of the wrong type is reported naming
the file and the field, and a cache file that fails is skipped with a warning, so one bad
file costs a fresh search rather than breaking every later run.

The cache keeps the latest record per (hardware, workload) key, one file each, under
``$AUTURI_CACHE_DIR``, else ``$XDG_CACHE_HOME/auturi``, else ``~/.cache/auturi``; an explicit
directory argument wins over all of them. A second run of the tuner measures the cached
choice first and may stop early once that measurement confirms it.

The cache is an optimisation, so it never stops a run: a directory that cannot be read or
written (no permission, a read-only file system, a full disk, a path under a file) is one
:class:`CacheWarning` per process and directory, naming the directory and the fix, and the
run goes on without it. A record owned by another user is not trusted (a planted record would
choose the first layout measured): it is skipped with a warning. A store writes a temporary
file beside the record, syncs it and renames it over the record, so a reader never sees half
a file, and removes the temporary file on every failure, Ctrl-C included.

Example:
    >>> import tempfile
    >>> from auturi.tuner.cache import ResultsCache
    >>> cache = ResultsCache(tempfile.mkdtemp())
    >>> hw, wl = {"cpu_model": "x", "cores": 2}, {"env": "CartPole-v1", "num_envs": 8}
    >>> path = cache.store({"hardware": hw, "workload": wl, "choice": {"config": {"envs_per_actor": 8}}})
    >>> cache.load(hw, wl)["choice"]["config"]
    {'envs_per_actor': 8}
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import secrets
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from auturi.config import Config

RECORD_SCHEMA = 1
CACHE_ENV_VAR = "AUTURI_CACHE_DIR"
TMP_PREFIX = ".tmp-"
"""Temporary files of an atomic write start with this (and are removed on every failure)."""


class CacheWarning(UserWarning):
    """The results cache could not be used (a directory that cannot be read or written, a
    record someone else owns); the run goes on without it."""


_warned_dirs: set[str] = set()  # directories this process has warned about (one warning each)
_warned_lock = threading.Lock()

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


# ---------------------------------------------------------------------------- fingerprints
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> int | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        return None


def _torch_info() -> tuple[str | None, list[str]]:
    try:
        import torch
    except ImportError:
        return None, []
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return str(torch.__version__), gpus


def hardware_fingerprint() -> dict[str, Any]:
    """What about this machine decides the best layout: CPU model, usable cores, memory,
    GPUs, torch version, OS and architecture."""
    from auturi.tuner.space import usable_cores

    torch_version, gpus = _torch_info()
    return {"cpu_model": _cpu_model(), "cores": usable_cores(), "logical_cpus": os.cpu_count(),
            "memory_gib": _memory_gib(), "gpus": gpus, "torch": torch_version,
            "platform": f"{platform.system()}-{platform.machine()}"}


def _unwrapped(fn: Any) -> Any:
    """The factory inside an :class:`auturi.envs.ProcessTreeEnvFn` (the wrapper every env
    factory gets): the wrapper's own name would give every env the same cache key."""
    try:
        from auturi.envs import ProcessTreeEnvFn
    except ImportError:
        return fn
    while type(fn) is ProcessTreeEnvFn and getattr(fn, "fn", None) is not None:  # subclasses name themselves
        fn = fn.fn
    return fn


def describe_callable(fn: Any) -> str:
    """A stable name for an env factory or model factory (no memory addresses)."""
    fn = _unwrapped(fn)
    env_id = getattr(fn, "env_id", None)
    if isinstance(env_id, str):  # auturi.envs._MakeById: gym.make(id)
        kw = getattr(fn, "kwargs", None)
        return f"gym:{env_id}" + (f" {json.dumps(kw, sort_keys=True, default=repr)}" if kw else "")
    if isinstance(fn, functools.partial):
        args = [_ADDR.sub("", repr(a)) for a in fn.args]
        args += [f"{k}={_ADDR.sub('', repr(v))}" for k, v in sorted(fn.keywords.items())]
        return f"{describe_callable(fn.func)}({', '.join(args)})"
    if isinstance(getattr(fn, "task_id", None), str) and hasattr(fn, "make_runner"):
        return f"envpool:{fn!r}"  # an EnvPool source: named by its task, not by where the class lives
    qual = getattr(fn, "__qualname__", None)
    if qual is not None:
        return f"{getattr(fn, '__module__', '?')}.{qual}"
    t = type(fn)
    name = f"{t.__module__}.{t.__qualname__}"
    r = repr(fn)
    # A callable object's repr names what it makes (e.g. EnvPoolSource('Pong-v5')) unless it
    # is the default one, which only adds a memory address.
    return name if _ADDR.search(r) or r.startswith("<") else f"{t.__module__}.{r}"


def _policy_description(policy: Any) -> dict[str, Any]:
    if policy is None:
        return {}
    t = type(policy)
    out: dict[str, Any] = {"class": f"{t.__module__}.{t.__qualname__}"}
    model_fn = getattr(policy, "model_fn", None)
    if model_fn is not None:
        out["model"] = describe_callable(model_fn)
    try:
        state = policy.get_state()
        shapes = sorted((k, list(getattr(v, "shape", ()))) for k, v in state.items())
        out["parameters"] = sum(_prod(s) for _, s in shapes)
        out["state_shapes"] = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:12]
    except Exception:  # noqa: BLE001, S110 - a policy without a usable get_state still gets a fingerprint
        pass
    return out


def _prod(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def workload_fingerprint(executor: Any, num_steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What about the workload decides the best layout: env, spaces, num_envs, policy,
    num_steps and the backend. ``extra`` (e.g. ``{"workload": "cartpole"}``) is merged in."""
    env_fns = getattr(executor, "env_fns", None) or []
    names = sorted({describe_callable(f) for f in env_fns})
    spec = getattr(executor, "spec", None)
    fp: dict[str, Any] = {
        "env": names[0] if len(names) == 1 else names,
        "observation_space": _ADDR.sub("", repr(getattr(spec, "observation_space", None))) if spec else None,
        "action_space": _ADDR.sub("", repr(getattr(spec, "action_space", None))) if spec else None,
        "num_envs": int(getattr(executor, "num_envs", 0) or 0),
        "policy": _policy_description(getattr(executor, "policy", None)),
        "num_steps": int(num_steps),
        "backend": str(getattr(executor, "backend", type(executor).__name__)),
    }
    if extra:
        fp.update(extra)
    return fp


def fingerprint_key(hardware: dict[str, Any], workload: dict[str, Any]) -> str:
    """A short, stable hash of both fingerprints (the cache file name)."""
    blob = json.dumps({"hardware": hardware, "workload": workload}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------- records
def save_record(record: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``record`` as JSON, atomically (a reader never sees half a file): a temporary
    file in the same directory, flushed to disk, then renamed over ``path``. The temporary file
    is removed on every failure, a ``KeyboardInterrupt`` included.

    Raises:
        OSError: the directory cannot be made or written (permission, read-only, disk full).
        ValueError: the record holds a value JSON cannot carry (NaN, infinity).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The name is chosen before the try, the file made inside it (O_EXCL): there is no moment
    # at which the file exists but the clean-up below would not run.
    tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}.json"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=False, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it the record
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable where the platform allows it (best effort: the
    record is already complete; only a power cut could undo the rename)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_record(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read a record written by :func:`save_record` (or ``TuneResult.save``) and check it
    (:func:`check_record`, with the ``required`` fields).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON (``json.JSONDecodeError``), or not a valid record; the
            message names the file and the field.
    """
    with open(path) as f:
        rec = json.load(f)
    try:
        check_record(rec, required)
    except ValueError as e:
        raise ValueError(f"{path} is not a valid Auturi results record: {e}") from None
    return rec


# What the loaders (TuneResult.from_record, Trial.from_dict, the cache's record_choice) read,
# and the type each must have: a record with a wrongly typed field is refused on load, naming
# the field, instead of breaking a later run with an AttributeError. Fields no loader reads
# (mean, counts, ...: derived, for people and other tools) and unknown keys (a newer record
# may add some) are not checked. "?" allows null.
_RECORD_FIELDS = {
    "mode": "str", "hardware": "dict", "workload": "dict", "strategy": "dict", "space": "dict",
    "protocol": "dict", "budget": "dict", "num_steps": "int", "start": "config", "cache_hit": "bool",
    "seconds": "num", "profile_seconds": "num", "startup": "startup", "trials": "trials", "final": "trials",
    "choice": "choice", "online": "dict?",
}
_CHOICE_FIELDS = {"config": "config", "throughput": "num?", "why": "str"}
_STARTUP_FIELDS = {"before_tune_seconds": "num?", "tune_setup_seconds": "num?"}
_TRIAL_FIELDS = {
    "config": "config", "samples": "nums", "warmup": "nums", "reconfigure_seconds": "num", "status": "str",
    "stop_reason": "str", "error": "str?", "source": "str", "predicted": "num?", "started": "num",
    "seconds": "num", "reconfigure": "dict?",
}
_OBJECTS = {"choice": _CHOICE_FIELDS, "startup": _STARTUP_FIELDS}
CACHE_REQUIRED = ("hardware", "workload", "choice.config")
"""The fields a cache record must have: the fingerprints it is filed under, and the choice."""


def check_record(rec: Any, required: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` naming the first field of ``rec`` that is missing (of ``required``,
    dotted paths such as ``"choice.config"``; every trial needs its ``config``) or has the wrong
    type for the loaders (a config must also be a valid :class:`~auturi.Config`).

    Example:
        >>> check_record({"choice": {"config": {"envs_per_actor": 8}, "throughput": 5.0}})
        >>> check_record({"choice": "nonsense"})
        Traceback (most recent call last):
        ...
        ValueError: choice must be a JSON object, got str 'nonsense'
    """
    _check_fields(rec, _RECORD_FIELDS, "")
    for dotted in required:
        node: Any = rec
        for i, key in enumerate(dotted.split(".")):
            if key not in node:
                where = ".".join(dotted.split(".")[:i])
                raise ValueError(f"{dotted} is missing" + (f" ({where} has no {key!r})" if where else ""))
            node = node[key]


def _check_fields(obj: Any, fields: dict[str, str], where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'the record'} must be a JSON object, got {_shown(obj)}")
    for key, kind in fields.items():
        if key in obj:
            _check_value(obj[key], kind, f"{where}.{key}" if where else key)


def _check_value(v: Any, kind: str, where: str) -> None:
    if kind.endswith("?"):
        if v is None:
            return
        kind = kind[:-1]
    if kind in _OBJECTS:
        _check_fields(v, _OBJECTS[kind], where)
    elif kind == "trials" or kind == "nums":
        if not isinstance(v, list):
            raise ValueError(f"{where} must be a JSON list, got {_shown(v)}")
        for i, x in enumerate(v):
            if kind == "nums":
                _check_value(x, "num", f"{where}[{i}]")
            else:
                _check_fields(x, _TRIAL_FIELDS, f"{where}[{i}]")
                if "config" not in x:
                    raise ValueError(f"{where}[{i}].config is missing (every trial names its config)")
    elif kind == "config":
        if not isinstance(v, dict):
            raise ValueError(f"{where} must be a JSON object of knobs, got {_shown(v)}")
        try:
            Config.from_dict(v)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where} is not a valid config ({e})") from None
    elif not _TYPE_CHECKS[kind](v):
        raise ValueError(f"{where} must be {_TYPE_NAMES[kind]}, got {_shown(v)}")


_TYPE_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "num": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
}
_TYPE_NAMES = {"str": "a string", "int": "an integer", "num": "a number", "bool": "true or false",
               "dict": "a JSON object"}


def _shown(v: Any) -> str:
    """A value's JSON kind and a short excerpt of it, for an error message."""
    names = {dict: "object", list: "list", str: "str", bool: "bool", int: "int", float: "float", type(None): "null"}
    r = repr(v)
    return f"{names.get(type(v), type(v).__name__)} {r[:40] + '...' if len(r) > 43 else r}"


def resolve_cache_dir(directory: str | os.PathLike | None = None) -> Path:
    """The cache directory: ``directory``, else ``$AUTURI_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/auturi``, else ``~/.cache/auturi``."""
    if directory is not None:
        return Path(directory).expanduser()
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "auturi"


def _warn_directory(directory: Path, what: str, error: BaseException) -> None:
    """One :class:`CacheWarning` per process and directory: what failed, why, and the fix."""
    key = str(directory)
    with _warned_lock:
        if key in _warned_dirs:
            return
        _warned_dirs.add(key)
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    if isinstance(error, (FileExistsError, NotADirectoryError)):
        blocker = next((q for q in (directory, *directory.parents) if q.is_file()), None)
        if blocker is not None:
            reason = f"{blocker} is a file, not a directory"
    warnings.warn(f"the Auturi results cache {directory} cannot be {what} ({reason}); going on without it. "
                  f"Set {CACHE_ENV_VAR}=/a/writable/dir to cache elsewhere, or turn the cache off "
                  f"(auturi tune --no-cache; cache=False in auturi.tune or Tuner; "
                  f"tuner_options={{'cache': False}} in auturi.wrap)", CacheWarning, stacklevel=3)


def _is_ours(st: os.stat_result) -> bool:
    """True when this process's user owns the file ``st`` describes (always, where the
    platform has no user ids)."""
    getuid = getattr(os, "getuid", None)
    return getuid is None or st.st_uid == getuid()


class ResultsCache:
    """The latest record per (hardware, workload) fingerprint, one JSON file each.

    Neither :meth:`load` nor :meth:`store` raises ``OSError``: a cache that cannot be used is
    a :class:`CacheWarning` and the run goes on (see the module's notes)."""

    STALE_TMP_SECONDS = 600.0
    """A temporary file this old was left by a process killed mid-store (SIGKILL): removed by
    the next store. A store takes milliseconds, so no live one is this old."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = resolve_cache_dir(directory)

    def path(self, hardware: dict[str, Any], workload: dict[str, Any]) -> Path:
        return self.directory / f"{fingerprint_key(hardware, workload)}.json"

    def load(self, hardware: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any] | None:
        """The cached record, or None: none there, the directory cannot be read (one
        :class:`CacheWarning` per directory), or, with a warning naming the file and the
        problem, an unreadable or invalid record (see :func:`check_record`) or one another
        user owns."""
        p = self.path(hardware, workload)
        try:
            with open(p, "rb") as f:  # bytes: a file that is not UTF-8 is an invalid record, not a crash
                st = os.fstat(f.fileno())  # the file read, not whatever the name points at later
                if not _is_ours(st):
                    me = os.getuid()  # _is_ours is only False where there are user ids
                    warnings.warn(f"ignoring Auturi cache file {p}: it belongs to user id {st.st_uid}, not to you "
                                  f"({me}), and a record someone else wrote could choose what your run measures "
                                  f"first. Delete it, or set {CACHE_ENV_VAR} to a directory only you can write",
                                  CacheWarning, stacklevel=2)
                    return None
                text = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None  # nothing cached (yet); a path under a file fails again, with the warning, in store()
        except OSError as e:
            _warn_directory(self.directory, "read", e)
            return None
        try:
            rec = json.loads(text)
        except ValueError as e:
            warnings.warn(f"ignoring unreadable Auturi cache file {p} ({e}); delete it to silence this",
                          CacheWarning, stacklevel=2)
            return None
        try:
            check_record(rec, CACHE_REQUIRED)
        except ValueError as e:
            warnings.warn(f"ignoring invalid Auturi cache file {p} ({e}); delete it to silence this",
                          CacheWarning, stacklevel=2)
            return None
        return rec

    def store(self, record: dict[str, Any]) -> Path | None:
        """Save ``record`` (it must hold ``hardware`` and ``workload``) under its key; returns
        the file, or None when it could not be written (one :class:`CacheWarning` per
        directory: permission, read-only file system, full disk, ...; nothing is left behind).

        Raises:
            ValueError: the record has no fingerprints, or holds NaN (a bug, not the disk).
        """
        try:
            hw, wl = record["hardware"], record["workload"]
        except KeyError as e:
            raise ValueError(f"a results record needs 'hardware' and 'workload' fingerprints; missing {e}") from None
        try:
            path = save_record(record, self.path(hw, wl))
        except OSError as e:
            _warn_directory(self.directory, "written", e)
            return None
        self._remove_stale_tmp()
        return path

    def _remove_stale_tmp(self) -> None:
        """Remove our temporary files that a killed process left (see ``STALE_TMP_SECONDS``)."""
        now = time.time()
        try:
            for p in self.directory.glob(f"{TMP_PREFIX}*.json"):
                try:
                    st = p.lstat()
                    if _is_ours(st) and now - st.st_mtime > self.STALE_TMP_SECONDS:
                        p.unlink()
                except OSError:
                    pass
        except OSError:
            pass

    def best(self, hardware: dict[str, Any], workload: dict[str, Any]) -> tuple[Config, float | None] | None:
        """The cached choice and its measured throughput, or None."""
        rec = self.load(hardware, workload)
        if not rec:
            return None
        return record_choice(rec)

    def clear(self) -> int:
        """Delete every cached record; returns how many."""
        n = 0
        if self.directory.is_dir():
            for p in self.directory.glob("*.json"):
                p.unlink()
                n += 1
        return n


def record_choice(record: dict[str, Any]) -> tuple[Config, float | None] | None:
    """``(config, steps/s)`` of a record's choice, or None if it has none."""
    choice = record.get("choice") or {}
    cfg = choice.get("config")
    if not cfg:
        return None
    try:
        return Config.from_dict(cfg), choice.get("throughput")
    except (ValueError, TypeError):
        return None


def open_cache(cache: bool | str | os.PathLike | ResultsCache | None) -> ResultsCache | None:
    """The tuners' ``cache`` argument: None/True the default directory, False none, a path
    that directory, or a :class:`ResultsCache`."""
    if cache is False:
        return None
    if cache is None or cache is True:
        return ResultsCache()
    if isinstance(cache, ResultsCache):
        return cache
    return ResultsCache(cache)

