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


class EnvCheckError(AuturiError, TypeError):
    """An env returned something that breaks gymnasium's API or its declared spaces: the
    message names the env index, the space, what was returned and how to fix it."""


class WorkerError(AuturiError, RuntimeError):
    """A worker process failed (raised, was killed by a signal, or made no progress for
    longer than the executor's ``worker_timeout``).

    ``traceback`` is the child's formatted traceback (empty for a killed or stuck process),
    ``worker`` names the process (e.g. ``"env worker 1 of actor 0 (envs 4-7)"``), ``config``
    is the config that was running and ``stack`` the stuck process's Python stack at the
    time it was found stuck (``faulthandler``'s dump, most recent call first; empty otherwise,
    and for a stopped process, which cannot dump).
    """

    def __init__(self, worker: str, reason: str, traceback: str = "", config: object = None, stack: str = ""):
        self.worker = worker
        self.reason = reason
        self.traceback = traceback
        self.config = config
        self.stack = stack
        msg = f"{worker} failed: {reason}"
        if config is not None:
            msg += f"\n  config: {config}"
        if traceback:
            msg += "\n  child traceback (most recent call last):\n" + _indent(traceback)
        if stack:
            msg += "\n  its Python stack when it was found stuck (most recent call first):\n" + _indent(stack)
        super().__init__(msg)

    def __reduce__(self) -> tuple:
        # Exceptions pickle as cls(*args), and args holds only the message: a WorkerError that
        # crossed a process (a Ray actor's) came back unreadable, its worker and stack lost.
        return type(self), (self.worker, self.reason, self.traceback, self.config, self.stack)


def _indent(text: str) -> str:
    return "".join("    " + line + "\n" for line in text.rstrip().splitlines())
