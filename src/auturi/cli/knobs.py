"""Parsing the command line's knob and device options (``--start``, ``--devices``,
``--address``/``--worker-timeout``) into what the tuner and executor take; every problem is a
:class:`~auturi.cli.common.CliError` line naming the fix, before any heavy import."""
from __future__ import annotations

import importlib.util
from typing import Any

from auturi.cli.common import fail
from auturi.config import DEVICE_PATTERN

__all__ = ["executor_kwargs", "parse_devices", "parse_start"]


def parse_start(text: str, num_envs: int) -> Any:
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
            fail(f"--start {text!r}: {part!r} is not KNOB=VALUE with KNOB one of {', '.join(names)}")
        if key == "policy_device":
            knobs[key] = value
            continue
        try:
            knobs[key] = int(value)
        except ValueError:
            fail(f"--start: {key}={value!r} must be an integer")
    actors = knobs.get("num_actors", 1)
    if isinstance(actors, int) and actors >= 1 and "envs_per_actor" not in knobs:
        if num_envs % actors:
            fail(f"--start: num_actors={actors} must divide --num-envs {num_envs}")
        knobs["envs_per_actor"] = num_envs // actors
    try:
        config = Config(**knobs)
    except ConfigError as e:
        fail(f"--start: {e}")
    if config.num_envs != num_envs:
        fail(f"--start: num_actors*envs_per_actor = {config.num_envs} but --num-envs is {num_envs}")
    return config


def parse_devices(devices: str | None, label: str | None = None) -> list[str] | None:
    if devices is None:
        return None
    label = label or f"--devices {devices}"
    out = [d.strip().lower() for d in devices.split(",") if d.strip()]
    if not out:
        fail("--devices is empty: pass cpu, cuda or cpu,cuda")
    for d in out:
        if not DEVICE_PATTERN.match(d):
            fail(f"--devices: {d!r} is not a device; use cpu, cuda or cuda:K, comma-separated")
    if any(d != "cpu" for d in out):
        from auturi.errors import ConfigError
        from auturi.resources import check_device  # reads the GPUs (imports torch) only for a CUDA device

        for d in out:
            try:
                check_device(d, use_cpu="cpu (--devices cpu)")
            except ConfigError as e:
                fail(f"{label}: {e.rule}")
    return list(dict.fromkeys(out))


def executor_kwargs(backend: str, address: str | None, worker_timeout: float | None) -> dict[str, Any]:
    """make_executor's keywords from --address and --worker-timeout, checked before any heavy
    import: a typo or a missing Ray should cost nothing."""
    if address is not None and backend != "ray":
        fail(f"--address {address} is for --backend ray (the Ray cluster to run on); got --backend {backend}")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        fail('--backend ray needs Ray, which is not installed: pip install "auturi[ray]"')
    if worker_timeout is not None and not worker_timeout > 0:
        fail(f"--worker-timeout must be a number of seconds > 0 (inf: never), got {worker_timeout:g}")
    kwargs: dict[str, Any] = {} if worker_timeout is None else {"worker_timeout": worker_timeout}
    if backend == "ray":
        kwargs["address"] = address
    return kwargs
