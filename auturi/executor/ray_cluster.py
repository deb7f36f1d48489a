"""The Ray cluster seen from the caller: its resources (defined in :mod:`auturi.resources`,
re-exported here) and the connection rules of the ``ray`` backend (see
:mod:`auturi.executor.ray_backend`): use the current connection, ``RAY_ADDRESS``, or a local
instance Auturi starts and shuts down when its last executor closes."""
from __future__ import annotations

import logging
import os
import socket
import threading

from auturi.errors import AuturiError
from auturi.resources import ClusterResources, ray_cluster_resources, usable_cores

__all__ = ["ClusterResources", "ray_cluster_resources", "connect", "release"]

_lock = threading.Lock()
_local = {"started": False, "users": 0}  # the local instance Auturi started, and its executors


def connect(address: str | None) -> bool:
    """Connect this process to Ray (see the module docstring); True when it uses a local
    instance Auturi started (then :func:`release` must be called once)."""
    import ray

    with _lock:
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if address not in (None, "auto", current):
                raise AuturiError(f"this process is already connected to the Ray cluster at {current}, "
                                  f"not address={address!r}: Ray talks to one cluster per process "
                                  f"(ray.shutdown() first, or pass address=None)")
            if _local["started"]:
                _local["users"] += 1
            return bool(_local["started"])
        target = address if address is not None else (os.environ.get("RAY_ADDRESS") or None)
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
        try:
            if target is not None:
                _check_reachable(target)
            if target is None:
                # "local": always a new instance, never one another process left on this machine
                ray.init(address="local", num_cpus=usable_cores(), include_dashboard=False, **quiet)
                _local.update(started=True, users=1)
                return True
            ray.init(address=target, **quiet)
        except Exception as exc:
            raise AuturiError(
                f"cannot connect to a Ray cluster at address={target!r}: {type(exc).__name__}: {exc}\n"
                f"  Start one on the head node with `ray start --head` (then address='auto' or "
                f"'HOST:6379'), or pass address=None (and unset RAY_ADDRESS) for a local Ray instance.") from exc
        return False


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` nobody listens on: ``ray.init`` retries such an
    address for minutes before it gives up."""
    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
        pass


def release() -> None:
    """One executor stopped using the local instance; shut it down when none uses it."""
    import ray

    with _lock:
        _local["users"] -= 1
        if _local["users"] <= 0 and _local["started"]:
            _local.update(started=False, users=0)
            ray.shutdown()


