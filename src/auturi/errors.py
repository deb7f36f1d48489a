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
    message names the env index, the call and the row of the collect where it happened, the
    space, what was returned and how to fix it. It is a ``TypeError`` too.

    Every reset and step of every env is checked (the rules: ``auturi.executor.spec``), in
    every layout, so the same fault is the same error wherever the env runs: from an env in a
    worker process it is a :class:`WorkerEnvCheckError`, both this and a
    :class:`WorkerError`, whose message carries this one's. ``except auturi.EnvCheckError``
    catches it in every layout. The executor checks the first reset of env 0 when it is
    built, so a wrong env fails there, not deep inside a collect:

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

    def __new__(cls, worker: str = "", reason: str = "", traceback: str = "", *args: object, **kw: object):
        # A worker's env that failed Auturi's env checks: the same EnvCheckError as in the
        # caller's process (issue 30 item 7), whoever builds the error from the worker's
        # traceback (the shm backend's control block, a Ray actor's, an actor passing it on).
        if cls is WorkerError and env_check_message(traceback):
            cls = WorkerEnvCheckError
        return super().__new__(cls)

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


TIMEOUT_FIX = ("worker_timeout=SECONDS in auturi.wrap(...), auturi.tune(...) or make_executor(...) (auturi tune: "
               "--worker-timeout S; any of them: the AUTURI_WORKER_TIMEOUT environment variable)")
"""How to raise the stuck-worker timeout, from whichever face the user runs: one place, so a
wrapped model's user is not told of a function they never call."""


class WorkerEnvCheckError(WorkerError, EnvCheckError):
    r"""An env in a worker process failed Auturi's env checks: an :class:`EnvCheckError` (as
    the same env in the caller's process raises) and a :class:`WorkerError` (the worker, its
    traceback, the config). ``check`` is the :class:`EnvCheckError`'s message, also the
    reason the first line gives:

    >>> import auturi
    >>> tb = ("Traceback (most recent call last):\n  ...\nauturi.errors.EnvCheckError: env 3: step() returned "
    ...       "an observation of shape (1,) ... (raised by env 3 in step() at row 2)\n")
    >>> e = auturi.WorkerError("env worker 1 of actor 0 (envs 2-3)", "raised an exception", tb)
    >>> isinstance(e, auturi.EnvCheckError), isinstance(e, auturi.WorkerError)
    (True, True)
    >>> print(str(e).splitlines()[0])
    env worker 1 of actor 0 (envs 2-3) failed: env 3: step() returned an observation of shape (1,) ... (raised by env 3 in step() at row 2)
    """

    def __init__(self, worker: str, reason: str, traceback: str = "", config: object = None, stack: str = ""):
        self.check = env_check_message(traceback) or reason
        if reason.startswith("raised "):  # the backends' words ("raised an exception"): say what
            reason = self.check
        super().__init__(worker, reason, traceback, config, stack)


_CHECK_PREFIX = "auturi.errors.EnvCheckError: "


def env_check_message(traceback: str) -> str:
    """The message of the :class:`EnvCheckError` a formatted ``traceback`` ends with (the
    exception raised last, not one it chained from), or ``""``."""
    if not traceback:
        return ""
    at = traceback.rfind("\n" + _CHECK_PREFIX)
    at = at + 1 if at >= 0 else (0 if traceback.startswith(_CHECK_PREFIX) else -1)
    if at < 0 or "Traceback (most recent call last):" in traceback[at:]:
        return ""
    return traceback[at + len(_CHECK_PREFIX):].split("\n", 1)[0].strip()


def _indent(text: str) -> str:
    return "".join("    " + line + "\n" for line in text.rstrip().splitlines())


class LostEnvChangesError(AuturiError):
    """A reconfigure would recreate envs (``envs``, global indices) that ``env_method`` or
    ``set_attr`` changed, losing the change. ``intact``: raised before the reconfigure changed
    anything (the executor goes on in its layout; a tuner may treat the layout as unavailable);
    False: found during the move, and the executor closed."""

    def __init__(self, envs: list[int], why: str, intact: bool = True):
        self.envs, self.intact = list(envs), intact
        super().__init__(f"this reconfigure would recreate env(s) {self.envs}, which env_method/set_attr calls "
                         f"changed, and lose those changes: {why}. Make the env picklable (cloudpickle) so it moves "
                         f"with its state, or keep this layout (auturi.wrap(..., config=...) fixes one), or make the "
                         f"change part of how the env is built (its constructor's kwargs)")

    def __reduce__(self) -> tuple:
        return (_lost_changes, (self.envs, self.args[0], self.intact))


def _lost_changes(envs: list[int], message: str, intact: bool) -> LostEnvChangesError:
    err = LostEnvChangesError.__new__(LostEnvChangesError)
    AuturiError.__init__(err, message)
    err.envs, err.intact = envs, intact
    return err


class EnvCallError(AuturiError):
    """An env raised in a call made on it through the executor (``env_method``,
    ``get_attr``, ``set_attr``): the message names the env (its global index) and the call;
    the env's own exception is ``__cause__`` (also ``original``; from a worker process it
    carries the worker's traceback as a note). The executor stays usable."""

    def __init__(self, env_id: int, what: str, original: BaseException):
        self.env_id, self.what, self.original = int(env_id), what, original
        super().__init__(f"env {self.env_id}: {what} raised {type(original).__name__}: {original}")

    def __reduce__(self) -> tuple:
        return (_rebuild_env_call_error, (self.env_id, self.what, self.original))


def _rebuild_env_call_error(env_id: int, what: str, original: BaseException) -> EnvCallError:
    err = EnvCallError(env_id, what, original)
    err.__cause__ = original
    return err
