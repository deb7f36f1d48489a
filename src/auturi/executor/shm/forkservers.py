"""Auturi's own forkservers: one with torch preloaded for the processes that run a policy,
and one per set of env factory modules for the rest (:class:`EnvProcess`).

Env workers must not import torch, so their server preloads only numpy, gymnasium, our worker
module and what the env factories name. A policy replica started from it would import torch itself:
1 to 4 s per replica per reconfigure on our 2-core machines, which dwarfed the tuner's
measurements. This server imports torch once (never initialising CUDA or thread pools), and
forks every policy process from it in milliseconds.

multiprocessing has one forkserver per process, reached through the module-level function
``forkserver.connect_to_new_process``. We reuse the stdlib's own ``ForkServer`` class and
``Popen._launch`` unchanged, only pointing the latter's ``forkserver`` global at our
instance, so nothing of the stdlib is copied here.

Start-up (:func:`start_servers`, :func:`wait_ready`): a caller that knows it will start
workers (``auturi tune``) starts both servers first thing, so their imports (gymnasium,
torch: seconds of a core) run on another core while the caller imports its own, probes the
env and builds the policy; before its first measurement it waits until both are serving,
so their imports never share the cores with a measured collect.
"""
from __future__ import annotations

import io
import multiprocessing.forkserver as _fs
import multiprocessing.popen_forkserver as _pf
import pickle
import sys
import threading
import time
import types
from multiprocessing.context import ForkServerProcess
from typing import Any

import cloudpickle

_PRELOAD_TORCH = ["auturi.executor.shm.preload", "torch"]
_lock = threading.Lock()
_servers: dict[tuple[str, ...], _fs.ForkServer] = {}
_target = threading.local()  # the server the Popen being built in this thread connects to


class _ServerModule:
    """Looks like the ``multiprocessing.forkserver`` module, but talks to our server (the one
    :meth:`TorchProcess._Popen` chose for the process being started)."""

    def connect_to_new_process(self, fds: Any) -> Any:
        return _target.server.connect_to_new_process(fds)

    def __getattr__(self, name: str) -> Any:
        return getattr(_fs, name)


def _server(preload: tuple[str, ...]) -> _fs.ForkServer:
    """The server preloading ``preload`` (one per distinct list, started on first use)."""
    with _lock:
        server = _servers.get(preload)
        if server is None:
            server = _servers[preload] = _fs.ForkServer()
            server.set_forkserver_preload(list(preload))
        return server


def _torch_server(extra: tuple[str, ...] = ()) -> _fs.ForkServer:
    """The server preloading torch and ``extra`` (a policy's ``preload_modules``, e.g. RLlib,
    whose import cost seconds per replica, and the env factories' modules: actors step envs)."""
    return _server(tuple(_PRELOAD_TORCH) + tuple(extra))


def preload_key(policy: Any) -> tuple[str, ...]:
    """The extra modules ``policy`` asks its processes to find imported (``preload_modules``)."""
    return tuple(sorted(set(getattr(policy, "preload_modules", ()) or ())))


def start_torch_server(extra: tuple[str, ...] = ()) -> None:
    """Start the server now; it imports torch (and ``extra``) while the caller goes on."""
    _torch_server(extra).ensure_running()


class _TorchPopen(_pf.Popen):
    pass


def _install_launch() -> None:
    launch = _pf.Popen._launch
    glb = dict(launch.__globals__)
    glb["forkserver"] = _ServerModule()
    _TorchPopen._launch = types.FunctionType(launch.__code__, glb, launch.__name__,  # type: ignore[method-assign]
                                             launch.__defaults__, launch.__closure__)


class PreloadedProcess(ForkServerProcess):
    """A forkserver process started from one of our servers (module-level: the process
    object is pickled to the server): the one preloading ``BASE`` plus ``preload``."""

    BASE: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        if not hasattr(_TorchPopen, "_auturi_ready"):
            _install_launch()
            _TorchPopen._auturi_ready = True  # type: ignore[attr-defined]
        _target.server = _server(type(process_obj).BASE + tuple(getattr(process_obj, "preload", ())))
        try:
            return _TorchPopen(process_obj)  # _launch runs now, in this thread
        finally:
            _target.server = None


class TorchProcess(PreloadedProcess):
    """A policy process: forked from the server with torch (and ``preload``) imported."""

    BASE = tuple(_PRELOAD_TORCH)


ENV_PRELOAD = ["auturi.executor.shm.preload"]
"""What every env workers' server preloads (:class:`EnvProcess`)."""


class EnvProcess(PreloadedProcess):
    """An env worker: forked from our server that imported :data:`ENV_PRELOAD` and the
    modules its env factories name (``preload``: SB3's ``Monitor``, the module defining the
    env), one server per set, so another executor's workers stay as they were (torch-free
    where their envs are). Never the standard forkserver, also with nothing of their own:
    whoever starts that one first sets its preload for the whole process, and SB3's
    ``SubprocVecEnv`` (built before ``auturi.wrap``) started it preloading nothing of ours,
    so each env worker imported gymnasium and auturi itself: 7 of them took 1.1 s to start
    instead of 0.1."""

    BASE = tuple(ENV_PRELOAD)


def start_env_server(extra: tuple[str, ...] = ()) -> None:
    """Start the env workers' server for factories naming ``extra`` (:class:`EnvProcess`); it
    imports while the caller goes on."""
    _server(tuple(ENV_PRELOAD) + tuple(extra)).ensure_running()


def modules_to_preload(obj: Any) -> tuple[str, ...]:
    """The modules a worker imports when it unpickles ``obj`` (env factories travel
    cloudpickled; what they name by module, such as SB3's ``Monitor`` or the module that
    defines an env, is imported on arrival), found by unpickling it here, where they are
    imported already. A worker importing them itself paid for them on every start: SB3's
    ``Monitor`` pulls in SB3 and torch, 1.4 s of a core per env worker on our 2-core machine."""
    found: list[str] = []

    class _Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module not in found:
                found.append(module)
            return super().find_class(module, name)

    try:
        _Recorder(io.BytesIO(cloudpickle.dumps(obj))).load()
    except Exception:  # an object that does not round-trip: its workers say why when they start
        return ()
    # What calling it imports beyond what its pickle names (``preload_modules``: an id's env
    # class, SB3's AtariWrapper, the id providers): without these, each env worker of an
    # Atari model imported SB3 and torch itself, 8 of them 9.5 s of a wrap on 2 cores.
    declared = getattr(obj, "preload_modules", ())
    found += [m for m in (declared if isinstance(declared, (tuple, list)) else ()) if isinstance(m, str)]
    return tuple(m for m in dict.fromkeys(found) if m.split(".")[0] not in _EVERY_WORKER_HAS)


_EVERY_WORKER_HAS = frozenset(sys.stdlib_module_names) | {"__main__", "cloudpickle", "auturi", "numpy", "gymnasium"}
"""Top-level packages every worker has imported or imports cheaply (the standard library;
:data:`ENV_PRELOAD` imports the rest): factories naming only these (a ``functools.partial`` of
an auturi or gymnasium env) fork from the server of :data:`ENV_PRELOAD` alone."""


def _noop() -> None:
    """The process :func:`wait_ready` starts: a server forks it only once its imports are done."""


def start_servers(torch: bool = True, extra: tuple[str, ...] = ()) -> None:
    """Start the env forkserver and, with ``torch``, the torch one preloading ``extra``;
    both import in the background. Only under the ``forkserver`` start method."""
    start_env_server()
    if torch:
        start_torch_server(extra)


def wait_ready(torch: bool = True, extra: tuple[str, ...] = (), env_extra: tuple[str, ...] = (),
               env: bool = True, timeout: float | None = None) -> float:
    """Block until the servers :func:`start_servers` started have finished their imports
    (a server answers a fork request only then): one no-op process is forked from each and
    joined (the env server, unless not ``env``: the one for factories naming ``env_extra``,
    see :class:`EnvProcess`; the torch one with ``torch``), each for up to ``timeout`` seconds
    (None: as long as it takes). Returns the seconds waited."""
    from auturi.executor.shm.processes import start_without_main  # the child need not import __main__

    t0 = time.perf_counter()
    procs: list[Any] = []
    if env:
        ep = EnvProcess(target=_noop, daemon=True)
        ep.preload = env_extra  # type: ignore[attr-defined]
        procs.append(ep)
    if torch:
        tp = TorchProcess(target=_noop, daemon=True)
        tp.preload = extra  # type: ignore[attr-defined]
        procs.append(tp)
    for p in procs:
        start_without_main(p)
    for p in procs:
        p.join(None if timeout is None else max(0.0, timeout - (time.perf_counter() - t0)))
    return time.perf_counter() - t0
