"""Exceptions raised to the user. Each names what is wrong and how to fix it."""
from __future__ import annotations


class AuturiError(Exception):
    """Base class of every error Auturi raises on purpose: catch it to handle them all.

    >>> import auturi
    >>> try:
    ...     auturi.Config(num_actors=2, envs_per_actor=4, env_parallel_degree=3)
    ... except auturi.AuturiError as e:
    ...     print(type(e).__name__, "-", e)
    ConfigError - env_parallel_degree=3 is invalid: must divide envs_per_actor=4 so each env worker steps the same number of envs
    """


class ConfigError(AuturiError, ValueError):
    """A config breaks a rule: the message names the knob, its value and the rule (also
    kept as ``knob``, ``value`` and ``rule``). It is a ``ValueError`` too.

    >>> import auturi
    >>> try:
    ...     auturi.Config(num_actors=0, envs_per_actor=4)
    ... except auturi.ConfigError as e:
    ...     print(e.knob, e.value, "|", e.rule)
    num_actors 0 | must be an integer >= 1
    """

    def __init__(self, knob: str, value: object, rule: str):
        self.knob = knob
        self.value = value
        self.rule = rule
        super().__init__(f"{knob}={value!r} is invalid: {rule}")


class EnvCheckError(AuturiError, TypeError):
    """An env returned something that breaks gymnasium's API or its declared spaces: the
    message names the env index, the space, what was returned and how to fix it. It is a
    ``TypeError`` too. The executor checks the first reset of env 0 when it is built, so a
    wrong env fails there, not deep inside a collect:

    >>> import auturi, gymnasium as gym
    >>> from auturi.envs import CountingEnv
    >>> class OldApiEnv(CountingEnv):   # gym < 0.26: reset() returned the observation alone
    ...     def reset(self, *, seed=None, options=None):
    ...         return super().reset(seed=seed)[0]
    >>> auturi.make_executor(OldApiEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=2, backend="serial")
    Traceback (most recent call last):
    ...
    auturi.errors.EnvCheckError: env 0: reset() returned an array of shape (4,) and dtype float32, not (obs, info) ...
    """


class WorkerError(AuturiError, RuntimeError):
    """A worker process failed (raised, was killed by a signal, or made no progress for
    longer than the executor's ``worker_timeout``).

    ``traceback`` is the child's formatted traceback (empty for a killed or stuck process),
    ``worker`` names the process (e.g. ``"env worker 1 of actor 0 (envs 4-7)"``), ``config``
    is the config that was running and ``stack`` the stuck process's Python stack at the
    time it was found stuck (``faulthandler``'s dump, most recent call first; empty otherwise,
    and for a stopped process, which cannot dump).

    A training loop that wants to log the failure and go on without the executor (which has
    closed itself) catches it around ``collect``::

        try:
            rollout = executor.collect(128)
        except auturi.WorkerError as e:
            log.error("%s failed: %s", e.worker, e.reason)  # also e.traceback, e.stack, e.config

    What such an error reads like (here built by hand, as the ``shm`` backend builds it when
    an env worker is killed); it keeps its fields across processes (Ray actors):

    >>> import pickle, auturi
    >>> e = auturi.WorkerError("env worker 1 of actor 0 (envs 4-7)", "was killed by signal SIGKILL",
    ...                        config=auturi.Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2))
    >>> print(e)
    env worker 1 of actor 0 (envs 4-7) failed: was killed by signal SIGKILL
      config: actors=2 x envs=4 | env_degree=2 | policies=1@cpu batch=4
    >>> pickle.loads(pickle.dumps(e)).worker
    'env worker 1 of actor 0 (envs 4-7)'
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
