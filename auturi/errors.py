"""Exceptions raised to the user. Each names what is wrong and how to fix it."""
from __future__ import annotations


class AuturiError(Exception):
    """Base class of every error Auturi raises on purpose."""


class ConfigError(AuturiError, ValueError):
    """A config breaks a rule: the message names the knob, its value and the rule."""

    def __init__(self, knob: str, value: object, rule: str):
        self.knob = knob
        self.value = value
        self.rule = rule
        super().__init__(f"{knob}={value!r} is invalid: {rule}")


class WorkerError(AuturiError, RuntimeError):
    """A worker process failed (raised, or was killed by a signal).

    ``traceback`` is the child's formatted traceback (empty for a killed process),
    ``worker`` names the process (e.g. ``"env worker 1 of actor 0 (envs 4-7)"``) and
    ``config`` is the config that was running.
    """

    def __init__(self, worker: str, reason: str, traceback: str = "", config: object = None):
        self.worker = worker
        self.reason = reason
        self.traceback = traceback
        self.config = config
        msg = f"{worker} failed: {reason}"
        if config is not None:
            msg += f"\n  config: {config}"
        if traceback:
            msg += "\n  child traceback (most recent call last):\n" + "".join(
                "    " + line + "\n" for line in traceback.rstrip().splitlines()
            )
        super().__init__(msg)
