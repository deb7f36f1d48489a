"""What the SB3 and RLlib faces share: the tuner's budget argument, the backends a face
accepts and the executor's stuck-worker bound."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FACE_BACKENDS = ("shm", "serial")
"""Backends ``auturi.wrap`` runs on. The ``ray`` backend runs through
``auturi.make_executor(..., backend="ray")``; the faces do not reach it yet."""


def tuner_kwargs(budget: Any) -> dict[str, Any]:
    """The online tuner's budget arguments from ``wrap(..., budget=)``: ``None`` (the tuner's
    defaults), an int (configs to measure), a float (seconds) or a dict of
    :class:`~auturi.tuner.OnlineTuner` keyword arguments.

    >>> tuner_kwargs(4), tuner_kwargs(30.0)
    ({'budget_trials': 4}, {'budget_trials': None, 'budget_seconds': 30.0})
    """
    if budget is None:
        return {}
    if isinstance(budget, Mapping):
        return dict(budget)
    if isinstance(budget, bool):
        raise TypeError("budget must be None, an int (configs to try), a float (seconds) or a dict")
    if isinstance(budget, int):
        return {"budget_trials": budget}
    if isinstance(budget, float):
        return {"budget_trials": None, "budget_seconds": budget}
    raise TypeError(f"budget must be None, an int (configs to try), a float (seconds) or a dict of OnlineTuner "
                    f"arguments, got {budget!r}")


def check_face_options(backend: Any, worker_timeout: Any) -> None:
    """Refuse, with the fix, a backend the faces do not run on or a timeout the executor would
    refuse (checked at wrap time: RLlib builds its executor only in ``build_algo()``)."""
    from auturi.executor.base import resolve_worker_timeout

    if backend not in FACE_BACKENDS:
        hint = (" (to collect on a Ray cluster today, build the executor yourself: "
                "auturi.make_executor(env, policy, num_envs, backend='ray', address=...))") if backend == "ray" else ""
        raise ValueError(f"backend must be one of {FACE_BACKENDS} for auturi.wrap, got {backend!r}{hint}")
    resolve_worker_timeout(worker_timeout)
