"""The six knobs of a collection layout (:class:`Config`) and their rules.

Example:
    >>> from auturi import Config
    >>> c = Config(num_actors=2, envs_per_actor=8, env_parallel_degree=4,
    ...            policies_per_actor=2, policy_batch_size=4)
    >>> c.num_envs
    16
    >>> Config.from_json(c.to_json()) == c
    True
    >>> print(Config.serial(16))
    actors=1 x envs=16 | env_degree=1 | policies=1@cpu batch=16
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from auturi.errors import ConfigError

DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")
"""How a policy device is written (``cpu``, ``cuda``, ``cuda:k``). Whether a CUDA device exists
is :func:`auturi.resources.check_device`'s to say (it reads the machine; a config is data)."""


@dataclass(frozen=True)
class Config:
    """One point of the layout space. Every field is validated on construction.

    The total number of envs is ``num_actors * envs_per_actor``; env ``i`` belongs to
    actor ``i // envs_per_actor``. No knob changes the data the learner receives.

    The six knobs (``Config.knob_names()``):

    - ``num_actors`` (>= 1): independent collection loops, each owning its envs and policy
      replicas; 1 runs in the caller's process.
    - ``envs_per_actor`` (>= 1): envs owned by one actor.
    - ``env_parallel_degree`` (divides ``envs_per_actor``): how many places step an actor's
      envs in parallel; the actor steps the first share, ``degree - 1`` env worker processes
      the others. 1 = all in the actor's own process (no IPC).
    - ``policies_per_actor`` (1 .. ``envs_per_actor``): policy replicas; 1 = inference in the
      actor's own process, more = that many inference worker processes.
    - ``policy_device`` (``cpu``, ``cuda``, ``cuda:k``; a CUDA device only where one exists):
      where the replicas run.
    - ``policy_batch_size`` (1 .. ``envs_per_actor``; 0 = ``envs_per_actor``): the most
      observations a replica takes in one forward pass; a smaller batch goes when waiting
      could not fill it, so nothing deadlocks. Below ``envs_per_actor`` (or with several
      replicas), with env workers and a policy on a device, env stepping overlaps inference
      (the attribute's docstring says how).

    A knob that breaks its rule raises :class:`~auturi.ConfigError` naming it:

    >>> from auturi import Config
    >>> Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2).num_envs
    8
    >>> Config(envs_per_actor=4, env_parallel_degree=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    auturi.errors.ConfigError: env_parallel_degree=3 is invalid: ...
    """

    num_actors: int = 1
    """Independent collection loops, each owning its envs and policy replicas (>= 1)."""
    envs_per_actor: int = 1
    """Envs owned by one actor (>= 1)."""
    env_parallel_degree: int = 1
    """How many places step an actor's envs in parallel, each ``envs_per_actor / degree``
    envs in turn: the actor's own process steps the first share and ``degree - 1`` env worker
    processes step the others. 1 = all envs step in the actor's own process. Must divide
    ``envs_per_actor``."""
    policies_per_actor: int = 1
    """Policy replicas inside an actor (1 .. envs_per_actor). 1 = inference runs in the
    actor's own process; more = that many inference worker processes."""
    policy_device: str = "cpu"
    """Where the replicas run: ``cpu``, ``cuda`` or ``cuda:k``."""
    policy_batch_size: int = field(default=0)
    """The most observations a replica takes in one forward pass (1 .. envs_per_actor);
    0 means ``envs_per_actor``. A smaller batch is sent when waiting could not fill it.

    With the other knobs it picks the actor's loop (``ActorPlan`` in
    ``auturi.executor.layout``); none changes the data:

    - lockstep: one replica (in the actor's process) and a batch of all the actor's envs:
      every env steps row by row, one forward pass a row;
    - overlapped: a smaller batch or several replicas, env workers (``env_parallel_degree``
      > 1) and a policy on a device (``cuda``): batches are spread over the env workers, so
      each worker's envs fall in different batches, and a worker queues the steps of several
      batches: it steps one batch's envs while another batch is in inference (Sample
      Factory's alternating halves), and ready envs go on without waiting for the rest
      (EnvPool's first-ready batches), the furthest behind first, so a slow env holds back
      only its own worker and catches up once it is done. It pays with
      replicas of their own (``policies_per_actor`` >= 2), since an actor's own replica
      stops its loop for each forward pass, and with batches of about
      ``envs_per_actor / policies_per_actor``;
    - general: the rest (a CPU policy, no env workers): whichever envs are ready go to a
      free replica. On the CPU, inference shares the cores with the env workers and
      spreading batches over them cost more wake-ups than it hid."""

    def __post_init__(self) -> None:
        for knob in ("num_actors", "envs_per_actor", "env_parallel_degree", "policies_per_actor"):
            v = getattr(self, knob)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(knob, v, "must be an integer >= 1")
        if self.envs_per_actor % self.env_parallel_degree:
            raise ConfigError(
                "env_parallel_degree", self.env_parallel_degree,
                f"must divide envs_per_actor={self.envs_per_actor} so each env worker "
                f"steps the same number of envs",
            )
        if self.policies_per_actor > self.envs_per_actor:
            raise ConfigError(
                "policies_per_actor", self.policies_per_actor,
                f"must be <= envs_per_actor={self.envs_per_actor}: a replica with no env "
                f"to serve would sit idle",
            )
        b = self.policy_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 0 or b > self.envs_per_actor:
            raise ConfigError(
                "policy_batch_size", b,
                f"must be an integer in 1..envs_per_actor={self.envs_per_actor} "
                f"(or 0 for envs_per_actor)",
            )
        if b == 0:
            object.__setattr__(self, "policy_batch_size", self.envs_per_actor)
        if not isinstance(self.policy_device, str) or not DEVICE_PATTERN.match(self.policy_device):
            raise ConfigError("policy_device", self.policy_device, "must be 'cpu', 'cuda' or 'cuda:k'")

    # ----------------------------------------------------------------- knobs
    @classmethod
    def knob_names(cls) -> tuple[str, ...]:
        """The six knobs, in declaration order: the one list the CLI, the tuner's space and
        strategies and the status server read.

        >>> Config.knob_names()[:2]
        ('num_actors', 'envs_per_actor')
        """
        return tuple(f.name for f in dataclasses.fields(cls))

    # ----------------------------------------------------------------- derived
    @property
    def num_envs(self) -> int:
        """Total envs across all actors."""
        return self.num_actors * self.envs_per_actor

    @property
    def envs_per_worker(self) -> int:
        """Envs stepped in turn by one env worker (or by the actor when degree is 1)."""
        return self.envs_per_actor // self.env_parallel_degree

    @property
    def is_serial(self) -> bool:
        """True when everything runs in the caller's process with no IPC."""
        return self.num_actors == 1 and self.env_parallel_degree == 1 and self.policies_per_actor == 1

    @property
    def num_processes(self) -> int:
        """Processes this config starts besides the caller's (the ``shm`` layout plan's
        count, ``plan_layout(config).num_processes``: tests/test_layout.py checks they agree)."""
        actors = self.num_actors if self.num_actors > 1 else 0
        envs = self.env_parallel_degree - 1
        pols = self.policies_per_actor if self.policies_per_actor > 1 else 0
        return actors + self.num_actors * (envs + pols)

    @property
    def processes_per_actor(self) -> int:
        """Processes one actor runs when it is its own process (as on the ``ray`` backend):
        itself, ``degree - 1`` env workers, and its replicas when there is more than one
        (each Ray actor's process count in the layout plan: tests/test_layout.py checks it)."""
        return self.env_parallel_degree + (self.policies_per_actor if self.policies_per_actor > 1 else 0)

    def actor_env_ids(self, actor: int) -> range:
        """Global ids of the envs actor ``actor`` owns."""
        return range(actor * self.envs_per_actor, (actor + 1) * self.envs_per_actor)

    # ----------------------------------------------------------- constructors
    @classmethod
    def serial(cls, num_envs: int, policy_device: str = "cpu") -> "Config":
        """The DummyVecEnv point: one actor, envs in-process, one policy, batch of all."""
        return cls(num_actors=1, envs_per_actor=num_envs, policy_device=policy_device)

    def replace(self, **changes: Any) -> "Config":
        """A copy with some knobs changed (validated)."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        unknown = sorted(set(d) - set(cls.knob_names()))
        if unknown:
            raise ConfigError(unknown[0], d[unknown[0]], f"is not a knob; {_knobs_hint(unknown[0])}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "Config":
        return cls.from_dict(json.loads(s))

    def __str__(self) -> str:
        return (
            f"actors={self.num_actors} x envs={self.envs_per_actor} | "
            f"env_degree={self.env_parallel_degree} | "
            f"policies={self.policies_per_actor}@{self.policy_device} batch={self.policy_batch_size}"
        )


def _knobs_hint(name: str) -> str:
    """"did you mean 'num_actors'? The knobs: ...", closest match first."""
    knobs = Config.knob_names()
    close = difflib.get_close_matches(name, knobs, n=1, cutoff=0.5)
    first = f"did you mean {close[0]!r}? " if close else ""
    return first + "the knobs: " + ", ".join(knobs)


_dataclass_init = Config.__init__


@functools.wraps(_dataclass_init)
def _init(self: Config, *args: Any, **kwargs: Any) -> None:
    # The dataclass's own __init__ says only "unexpected keyword argument": name the knobs.
    for name in kwargs:
        if name not in Config.knob_names():
            raise TypeError(f"auturi.Config has no knob {name!r}: {_knobs_hint(name)}")
    _dataclass_init(self, *args, **kwargs)


Config.__init__ = _init  # type: ignore[method-assign]


def total_envs_error(config: Config, num_envs: int, whose: str) -> ConfigError:
    """The error for a config whose ``num_actors * envs_per_actor`` is not the ``num_envs``
    that ``whose`` (e.g. "the model's n_envs") has, with the configs that fit.

    >>> e = total_envs_error(Config(num_actors=3), 4, "the model's n_envs")
    >>> print(e.rule)
    must equal the model's n_envs=4 (envs_per_actor defaults to 1); for 4 envs: Config(num_actors=1, envs_per_actor=4), Config(num_actors=2, envs_per_actor=2), Config(num_actors=4, envs_per_actor=1)
    """
    fits = ", ".join(f"Config(num_actors={a}, envs_per_actor={num_envs // a})"
                     for a in range(1, num_envs + 1) if num_envs % a == 0)
    return ConfigError("num_actors*envs_per_actor", config.num_envs,
                       f"must equal {whose}={num_envs} (envs_per_actor defaults to 1); for {num_envs} envs: {fits}")
