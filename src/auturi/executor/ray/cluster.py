"""The Ray cluster seen from the caller: its resources (defined in :mod:`auturi.resources`,
re-exported here) and the connection rules of the ``ray`` backend (see
:mod:`auturi.executor.ray`): use the current connection, ``RAY_ADDRESS``, or a local
instance Auturi starts and shuts down when its last executor closes."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping

from auturi.errors import AuturiError
from auturi.resources import ClusterResources, ray_cluster_resources, usable_cores

__all__ = ["ClusterResources", "ray_cluster_resources", "connect", "release", "check_actor_resources", "with_extra",
           "custom_of", "alive_node_resources", "unplaceable", "place_lines", "node_lost", "NODE_LOST_SECONDS",
           "lost_node_reason", "never_ran_hint"]

_lock = threading.Lock()
_local = {"started": False, "users": 0}  # the local instance Auturi started, and its executors


def connect(address: str | None) -> bool:
    """Connect this process to Ray (see the module docstring); True when it uses a local
    instance Auturi started (then :func:`release` must be called once)."""
    import ray

    with _lock:
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if address not in (None, "auto", current) and _canonical(address) != current:
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
            raise AuturiError(_connect_failure(target, exc)) from exc
        return False


def _connect_failure(target: str | None, exc: BaseException) -> str:
    """What went wrong connecting to ``target``, and the fix."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if any(type(e).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(e) for e in chain):
        # Ray's own error says only "Failed to connect", after ~20 s of retries.
        return (f"the Ray cluster at address={target!r} refused this process's credentials: it uses token "
                f"authentication and this process does not, or has another token (RAY_AUTH_MODE here: "
                f"{os.environ.get('RAY_AUTH_MODE', 'unset')}; `ray start` turns token mode on when ~/.ray/auth_token "
                f"exists, a driver given an explicit address never does).\n  Set RAY_AUTH_MODE=token here with the "
                f"cluster's token (~/.ray/auth_token or RAY_AUTH_TOKEN), or start every node of the cluster with "
                f"RAY_AUTH_MODE=disabled.")
    return (f"cannot connect to a Ray cluster at address={target!r}: {type(exc).__name__}: {exc}\n"
            f"  Start one on the head node with `ray start --head` (then address='auto' or "
            f"'HOST:6379'), or pass address=None (and unset RAY_ADDRESS) for a local Ray instance.")


def _canonical(address: str) -> str | None:
    """``address`` as Ray writes the current one (``127.0.0.1`` and ``localhost`` become this
    node's IP), so the same cluster named two ways is not refused."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - a private helper: compare as written when it moves
        return address


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



# ---------------------------------------------------------------- lost nodes
NODE_LOST_SECONDS = 30.0
"""How long an actor that stopped answering (``ActorUnavailableError``) may wait for the GCS
to say whether its node is dead: it marks a node dead only after missing several health
checks (~15 s by Ray's defaults), while the actor's socket closes at once."""


def node_lost(node_id: str, wait: float = 0.0) -> bool:
    """Whether Ray node ``node_id`` is dead (or gone from the cluster's table); with ``wait``,
    ask the GCS again every half second until it says so or ``wait`` seconds pass."""
    import ray

    deadline = time.monotonic() + wait
    while True:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if node_id not in alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)  # a GCS query per half second: its verdict has no event to wait on


def lost_node_reason(node_id: str, ip: str) -> str:
    """Why an actor on a lost node failed, and what to do (the ``WorkerError`` reason)."""
    return (f"its Ray node {node_id} ({ip}) was lost (stopped, crashed, out of memory or cut off from the "
            f"cluster): the episodes of its envs are gone and nothing is restarted (new envs would change the "
            f"data). Restart that node or leave it out, then build the executor again (a new "
            f"auturi.wrap(...) or make_executor(...); `ray status` lists the nodes alive)")


def never_ran_hint(death: str) -> str:
    """For an actor that died before it ran because Ray saw no reference to it left (``death``:
    Ray's message), the cause seen in practice and its fix; else ``""``.

    >>> never_ran_hint("The actor is dead because all references to the actor were removed.")[:49]
    '; seen when this process and the cluster disagree'
    >>> never_ran_hint("The actor died because its node died.")
    ''
    """
    if "all references to the actor were removed" not in death:  # Ray 2.60's wording
        return ""
    mode = os.environ.get("RAY_AUTH_MODE", "unset")
    return ("; seen when this process and the cluster disagree on token authentication: the cluster's calls "
            f"to this process are refused, so Ray drops the actors it creates (RAY_AUTH_MODE here: {mode}; Ray "
            "sets it to 'token' in a process that started a local instance, and an unset one means token when "
            "~/.ray/auth_token exists and ray.init() found the cluster by itself). Start the cluster's nodes and "
            "this process with the same RAY_AUTH_MODE")


# ---------------------------------------------------------------- per-actor resources
def check_actor_resources(extra: Mapping[str, float] | None) -> dict[str, float]:
    """``actor_resources`` checked: resource names to amounts >= 0 (zeros dropped).

    >>> check_actor_resources({"CPU": 2, "node_b": 0.5, "GPU": 0})
    {'CPU': 2.0, 'node_b': 0.5}
    """
    out: dict[str, float] = {}
    for name, amount in dict(extra or {}).items():
        try:
            value = float(amount)
        except (TypeError, ValueError):
            value = float("nan")
        if not isinstance(name, str) or not value >= 0:
            raise ValueError(f"actor_resources must map resource names to amounts >= 0, got {name!r}: {amount!r}")
        if value:
            out[name] = value
    return out


def with_extra(bundle: Mapping[str, float], extra: Mapping[str, float]) -> dict[str, float]:
    """The layout's bundle raised to at least ``extra``'s CPU and GPU, plus its custom resources.

    >>> with_extra({"CPU": 3}, {"CPU": 1, "GPU": 0.5, "node_b": 1})
    {'CPU': 3, 'GPU': 0.5, 'node_b': 1}
    """
    out = dict(bundle)
    for name, amount in extra.items():
        out[name] = max(out.get(name, 0), amount) if name in ("CPU", "GPU") else amount
    return out


def custom_of(bundle: Mapping[str, float]) -> dict[str, float]:
    """The bundle's custom resources (what ``.options(resources=...)`` takes)."""
    return {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}


def alive_node_resources() -> list[dict[str, float]]:
    """Every alive node's total resources (what it could hold when idle)."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def unplaceable(bundle: Mapping[str, float], count: int, nodes: list[dict[str, float]]) -> str | None:
    """Why ``count`` copies of ``bundle`` cannot fit the idle ``nodes`` (first fit; an actor
    never spans nodes), or None. Checked before asking Ray, which would wait for resources
    that will never come.

    >>> unplaceable({"CPU": 2, "node_b": 1}, 2, [{"CPU": 8, "node_a": 1}, {"CPU": 8, "node_b": 1}])
    "2 actors of {'CPU': 2, 'node_b': 1} each: the alive nodes hold 1 (node totals: [{'CPU': 8, 'node_a': 1}, {'CPU': 8, 'node_b': 1}]); ask for less per actor (e.g. smaller custom_resources_per_env_runner), run fewer actors, or add nodes"
    """
    free = [dict(n) for n in nodes]
    placed = 0
    for _ in range(count):
        node = next((n for n in free if all(n.get(k, 0) + 1e-9 >= v for k, v in bundle.items())), None)
        if node is None:
            break
        for k, v in bundle.items():
            node[k] = node.get(k, 0) - v
        placed += 1
    if placed == count:
        return None
    shown = [{k: v for k, v in n.items() if k in bundle or not k.startswith(("node:", "memory", "object_store"))}
             for n in nodes]
    return (f"{count} actors of {dict(bundle)} each: the alive nodes hold {placed} (node totals: {shown}); ask for "
            f"less per actor (e.g. smaller custom_resources_per_env_runner), run fewer actors, or add nodes")


def place_lines(places: list[dict]) -> list[str]:
    """One line per actor of an executor's ``actor_places``, as the CLI prints them.

    >>> place_lines([{"actor": 0, "envs": [0, 3], "node": "ab12cd34ef56aa", "ip": "10.0.0.2", "pid": 41}])
    ['actor 0 (envs 0-3): node ab12cd34ef56 (10.0.0.2), pid 41']
    """
    return [f"actor {p['actor']} (envs {p['envs'][0]}-{p['envs'][-1]}): node {str(p['node'])[:12]} ({p['ip']}), "
            f"pid {p['pid']}" for p in places]
