"""The executor contract every backend implements, and what the backends share: input
resolution, probing, the rollout arrays, per-env noise and building the :class:`Rollout`.

The contract has two halves: the faces' (``collect``, ``reconfigure``, ``set_policy_state``,
``close``, and the calls on the live envs ``env_method``, ``get_attr``, ``set_attr``,
``env_call``) and the tuner's (``move_cost``, ``prepare``, ``warming``; written down in
:mod:`auturi.executor.contract` as :class:`~auturi.executor.contract.ExecutorLike`). A
backend implements the first through ``_apply_config``, ``_run_actors`` and the other
abstract methods, and answers the second through the hooks ``_processes_started``,
``_cold_servers`` and ``_warm_for`` (defaults: the ``shm`` plans' diff, nothing to warm).

Over 400 lines: :class:`Executor` is what every backend inherits, the contract's public
methods (the env calls among them, with their argument handling and refusals) written once
over the backends' hooks; splitting it would make each backend import two halves of one class.

Example:
    >>> import auturi
    >>> from auturi.envs import CountingEnv
    >>> from auturi.policy import RandomPolicy
    >>> import gymnasium as gym
    >>> with auturi.make_executor(CountingEnv, RandomPolicy(gym.spaces.Discrete(3)), num_envs=4,
    ...                           backend="serial") as ex:
    ...     r = ex.collect(8)
    >>> r.observations.shape, r.actions.shape
    ((8, 4, 4), (8, 4))
"""
from __future__ import annotations

import abc
import math
import os
import time
from typing import Any, Mapping

import numpy as np

from auturi.config import DEVICE_PATTERN, Config, total_envs_error
from auturi.envs import EnvLike, resolve_env_fns
from auturi.errors import AuturiError
from auturi.executor.buffers import ArrayBlock
from auturi.executor.contract import MoveCost, started_devices
from auturi.executor.env_calls import ENV_CALL_KINDS, EnvCall, no_env_objects_message, travels_with_state
from auturi.executor.layout import LayoutPlan, ProcessPlan, plan_layout
from auturi.executor.noise import NoiseStreams
from auturi.executor.spec import WorkloadSpec, probe_reset, probe_spec
from auturi.policy import Policy
from auturi.resources import check_device
from auturi.rollout import CollectStats, Rollout

WORKER_TIMEOUT = 60.0
"""Default ``worker_timeout``: a worker process (env worker, policy replica, actor) whose task
goes this long without one of its envs' resets or steps (or a policy batch) returning is
reported stuck; start-up work (building envs, each env's first reset) is allowed
``max(worker_timeout, 60 s)``. Fixed rather than derived from measured
step times: a false alarm ends a training run while a late one costs a minute, and a step
time measured on the first collects says nothing of a GC pause, a checkpoint an env writes
or a VM's stolen time later on. No step or policy batch of a healthy workload takes a
minute; one that does passes ``worker_timeout``. ``AUTURI_WORKER_TIMEOUT`` overrides it."""


def resolve_worker_timeout(worker_timeout: float | None) -> float:
    """``worker_timeout``, or ``AUTURI_WORKER_TIMEOUT``, or :data:`WORKER_TIMEOUT`, checked.

    >>> resolve_worker_timeout(5), resolve_worker_timeout(math.inf)
    (5.0, inf)
    """
    if worker_timeout is None:
        worker_timeout = os.environ.get("AUTURI_WORKER_TIMEOUT", WORKER_TIMEOUT)
    try:
        seconds = float(worker_timeout)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not seconds > 0:
        raise ValueError(f"worker_timeout must be a number of seconds > 0 (math.inf: never), got {worker_timeout!r}")
    return seconds


def given_num_envs(num_envs: int | None, config: Config | None) -> int | None:
    """The total envs a caller gave: ``num_envs``, else the ``config``'s (a list of factories
    is then checked against it), else None (a list of factories sets it)."""
    return config.num_envs if num_envs is None and config is not None else num_envs


class Executor(abc.ABC):
    """Runs collection under a :class:`Config`; the data never depends on the config.

    Subclasses provide ``_apply_config``, ``_run_actors``, ``_close_workers`` and
    ``_call_envs`` (with ``_refuse_lost_changes`` where a reconfigure may recreate envs).

    ``worker_timeout`` (seconds; ``None``: ``AUTURI_WORKER_TIMEOUT`` or 60 s, see
    :data:`WORKER_TIMEOUT`; ``math.inf``: never) bounds one env's silence: how long a worker
    process may go without one of its envs' resets or steps (or a policy batch) returning.
    Past it the collect raises :class:`auturi.WorkerError` naming the worker, its envs and
    the config, with the stuck process's Python stack (or that it is stopped), and the
    executor closes. In the caller's own process (the ``serial`` backend, ``shm``'s actor in
    the caller) a watchdog thread holds the same bound: a stuck env reset or step, or policy
    batch, is printed to stderr with the thread's stack, interrupted and raised as
    :class:`auturi.WorkerError` naming the env; first resets get ``max(worker_timeout, 60)``
    s. C code that never returns to Python cannot be interrupted there: run such envs in env
    workers (``env_parallel_degree`` > 1), whose processes are ended.

    Every reset and step of every env is checked against gymnasium's API and the declared
    spaces (:class:`auturi.EnvCheckError`, the same in every layout). ``check_finite=True``
    also refuses NaN and inf in observations and rewards (off by default, as in gymnasium's
    own checker: a NaN is stored as the env returned it).

    ``env_id_offset`` is the global index of this executor's first env: seeds and noise
    streams are keyed by global indices (and ``final_observations``/``final_infos`` are
    reported under them), so a slice of a larger collection (envs ``offset ..
    offset + num_envs - 1``, as one Ray actor runs) gives exactly the data it would give
    inside the whole. Columns of the arrays stay local (0 .. num_envs - 1).

    Build one with :func:`auturi.make_executor`; close it (or use ``with``) to end its
    workers. Whatever the config, a collect returns the serial loop's data:

    >>> import auturi, gymnasium as gym, numpy as np
    >>> from auturi.envs import CountingEnv
    >>> policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    >>> two_actors = auturi.Config(num_actors=2, envs_per_actor=2, policy_batch_size=1)
    >>> with auturi.make_executor(CountingEnv, policy, num_envs=4, backend="serial") as ex:
    ...     serial = ex.collect(8)
    >>> with auturi.make_executor(CountingEnv, policy, num_envs=4, backend="serial", config=two_actors) as ex:
    ...     print(ex.config)
    ...     split = ex.collect(8)
    actors=2 x envs=2 | env_degree=1 | policies=1@cpu batch=1
    >>> all(np.array_equal(serial.arrays()[k], split.arrays()[k]) for k in serial.arrays())
    True

    Calls on the live envs (:meth:`env_method`, :meth:`get_attr`, :meth:`set_attr`, SB3's
    VecEnv signatures; :meth:`env_call` underneath) run between collects on the envs that
    train, wherever they are (the caller's process, actor processes, env workers, Ray actors),
    and answer in the order of ``indices``, the same in every layout. A change they make
    travels with its env through every reconfigure; where it could not (an env that cannot be
    pickled or whose pickle drops the change, Ray actors that restart) the reconfigure is refused with an
    :class:`~auturi.AuturiError` rather than drop it. Vector-env sources (EnvPool, ale-py's
    ``AtariVectorEnv``) have no Python object per env: these calls raise there.

    >>> with auturi.make_executor(CountingEnv, policy, num_envs=4, backend="serial", config=two_actors) as ex:
    ...     ex.set_attr("max_len", 5, indices=[0, 1])
    ...     ex.get_attr("max_len")
    ...     ex.env_method("get_wrapper_attr", "max_len", indices=-1)
    [5, 5, 12, 12]
    [12]
    """

    backend = "base"

    def __init__(self, env: EnvLike, policy: Policy, num_envs: int | None = None,
                 config: Config | None = None, seed: int = 0, env_id_offset: int = 0,
                 worker_timeout: float | None = None, check_finite: bool = False):
        self.worker_timeout = resolve_worker_timeout(worker_timeout)
        self.check_finite = bool(check_finite)
        self.env_fns = resolve_env_fns(env, given_num_envs(num_envs, config))
        self.num_envs = len(self.env_fns)
        _check_policy(policy)
        self.policy = policy
        self.seed = int(seed)
        self.env_id_offset = int(env_id_offset)
        self._closed = False
        self._config: Config | None = None
        self._block: ArrayBlock | None = None
        self._num_steps = -1
        self._steps_done = 0  # steps each env has taken so far: keys the noise streams
        self._noise = NoiseStreams()
        self._weights_version = 0
        self.last_reconfigure_seconds = 0.0
        self.last_reconfigure: dict[str, float] = dict(_NOTHING_DONE)
        self._counts: dict[str, int] = {}
        self._applying: Config | None = None
        self._touched: set[int] = set()  # envs a call may have changed (env_method, set_attr): see env_call
        self._pinned: set[int] = set()  # of those, envs whose pickle drops the change (EnvRunner.travel_checks)
        self._busy: str | None = None  # the collect, reconfigure or env call running (env calls wait for none)
        probe_env = self.env_fns[0]()
        try:
            obs = probe_reset(probe_env, self.seed)
            self.spec: WorkloadSpec = probe_spec(probe_env.observation_space, probe_env.action_space, policy, obs)
            self.envs_movable = travels_with_state(probe_env, self.seed)
        finally:
            probe_env.close()
        self.reconfigure(config or Config.serial(self.num_envs))

    # ------------------------------------------------------------------ contract
    @property
    def config(self) -> Config:
        assert self._config is not None
        return self._config

    def reconfigure(self, config: Config) -> float:
        """Switch to ``config``; returns the seconds it took (also in
        ``last_reconfigure_seconds``).

        Running episodes go on where the backend can: ``serial`` never moves an env;
        ``shm`` keeps the processes whose role is unchanged and moves the other envs live to
        their new process (when ``envs_movable``), so their next observation is the one they
        would have given anyway. An env that cannot move is recreated with a new seed and its
        next observation starts a new episode (``episode_starts`` True at row 0 without a
        done before it); ``ray`` keeps its Ray actors when every actor keeps its envs and
        bundle (a batch change) and moves envs live inside them, else restarts them with new
        envs. ``last_reconfigure`` reports
        ``{"seconds", "kept", "started", "ended", "moved", "recreated"}``: worker processes
        kept, started and ended, envs moved to another process, envs recreated.

        An env that a call changed (:meth:`env_method`, :meth:`set_attr`) keeps the change
        wherever it moves; a reconfigure that would recreate such an env (it cannot be pickled,
        its pickle does not keep the change, checked after each such call, or Ray actors
        restart) raises :class:`~auturi.AuturiError` naming the envs, before
        anything changes where that is known beforehand (the executor stays as it was), else
        as it finds out (the executor closes): :class:`LostEnvChangesError` (``intact`` says which; :mod:`auturi.errors`)."""
        self._check_open()
        self.validate(config)
        if config == self._config:
            self.last_reconfigure_seconds = 0.0
            self.last_reconfigure = dict(_NOTHING_DONE)
            return 0.0
        if self._touched and self._config is not None:
            self._refuse_lost_changes(config)
        t0 = time.perf_counter()
        self._counts = {}
        self._busy = "a reconfigure"
        try:
            self._apply_config(config)
        except BaseException:
            self.close()
            raise
        finally:
            self._busy = None
        self._config = config
        self.last_reconfigure_seconds = time.perf_counter() - t0
        self.last_reconfigure = {**_NOTHING_DONE, **self._counts, "seconds": self.last_reconfigure_seconds}
        return self.last_reconfigure_seconds

    def validate(self, config: Config) -> None:
        """Raise :class:`ConfigError` if ``config`` cannot run here."""
        if not isinstance(config, Config):
            raise TypeError(f"expected an auturi.Config, got {type(config).__name__}")
        if config.num_envs != self.num_envs:
            raise total_envs_error(config, self.num_envs, "the executor's num_envs")
        check_device(config.policy_device)

    def collect(self, num_steps: int) -> Rollout:
        """Step every env exactly ``num_steps`` times; return the transitions (copies)."""
        self._check_open()
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be an integer >= 1, got {num_steps!r}")
        t0 = time.perf_counter()
        self._busy = "a collect"
        try:
            self._prepare(num_steps)
            env_s, pol_s, wait_s = self._run_actors(num_steps)
            finals = self._gather_finals()
        except BaseException:
            self.close()
            raise
        finally:
            self._busy = None
        self._steps_done += num_steps
        rollout = self._build_rollout(finals)
        rollout.stats = CollectStats(num_steps * self.num_envs, time.perf_counter() - t0, env_s, pol_s, wait_s)
        return rollout

    def set_policy_state(self, state: Mapping[str, Any]) -> None:
        """Send new weights to every replica; they take effect from the next collect.

        Values are numpy arrays or torch tensors (a ``state_dict()``, on any device): a tensor
        comes to the host here, once per update however many replicas load it (the SB3 face
        hands numpy, already on the host: ``ModelViews.arrays``)."""
        self._check_open()
        self._weights_version += 1
        # Duck-typed, so this module never imports torch: .detach() for a tensor that requires
        # grad, .cpu() a no-op for one on the CPU (its .numpy() a view, copied when published).
        self._publish_weights({k: v.detach().cpu().numpy() if hasattr(v, "detach") and hasattr(v, "cpu")
                               else np.asarray(v) for k, v in state.items()}, self._weights_version)

    # ------------------------------------------------- contract: calls on the live envs
    def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list:
        """Call ``method_name(*method_args, **method_kwargs)`` on the envs ``indices`` (None:
        all; an int; a list), looked up through gymnasium wrappers as SB3's ``DummyVecEnv``
        does; returns the results in the order of ``indices``. See :meth:`env_call`."""
        return self.env_call("method", method_name, method_args, method_kwargs, indices)

    def get_attr(self, attr_name: str, indices: Any = None) -> list:
        """Attribute ``attr_name`` of the envs ``indices`` (through gymnasium wrappers, as
        ``DummyVecEnv``), in the order of ``indices``. See :meth:`env_call`."""
        return self.env_call("get", attr_name, indices=indices)

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        """Set attribute ``attr_name`` to ``value`` on the envs ``indices`` (on each env
        object itself, its outermost wrapper: ``setattr``, as ``DummyVecEnv``). See
        :meth:`env_call`."""
        self.env_call("set", attr_name, (value,), indices=indices)

    def env_call(self, kind: str, name: str, args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                 indices: Any = None) -> list:
        """One call on the live envs, the same in every backend and layout: ``kind``
        ``"method"`` (call ``name(*args, **kwargs)``), ``"get"`` (read attribute ``name``) or
        ``"set"`` (set it to ``args[0]``), on envs ``indices`` (None: every env; an int; a list
        of ints, negative ones counting from the end, repeats allowed: SB3's ``indices``);
        returns one result per index, in their order (``None`` for ``"set"``).

        It runs on the envs that train, wherever they are: the caller's own runner, an actor
        process's share, env worker processes (the request and the answer travel pickled over
        each worker's pipe), Ray actors. Only between collects: while a collect or reconfigure
        runs (another thread) it raises :class:`~auturi.AuturiError`. An env that raises
        comes back as :class:`~auturi.errors.EnvCallError` naming the env and the
        call, the env's exception as its cause (the first env in ``indices`` order that raised;
        envs in other processes may have run the call meanwhile); the executor stays usable. A
        ``"method"`` or ``"set"`` call marks its envs as changed: they keep the change through
        every reconfigure (see :meth:`reconfigure`). Arguments and results travel pickled
        (cloudpickle) to and from envs in other processes: a result that cannot be pickled is
        an :class:`~auturi.AuturiError` there (in the caller's process it is returned as it is,
        as SB3's ``DummyVecEnv`` returns it). Vector-env sources (EnvPool, ale-py's
        ``AtariVectorEnv``) have no Python object per env: :class:`~auturi.AuturiError`."""
        self._check_open()
        if kind not in ENV_CALL_KINDS:
            raise ValueError(f"kind must be one of {ENV_CALL_KINDS}, got {kind!r}")
        if not isinstance(name, str):
            raise TypeError(f"the method or attribute name must be a str, got {type(name).__name__}")
        ids = self._env_indices(indices)
        results = self.run_env_call(EnvCall(kind, name, tuple(args), dict(kwargs or {}), tuple(ids)))
        return [results[p] for p in range(len(ids))]

    def run_env_call(self, call: EnvCall) -> dict[int, Any]:
        """Run ``call`` (its ``ids``: this executor's local env indices) and return position
        in ``call.ids`` -> result: :meth:`env_call` without the argument handling, the entry
        a Ray actor runs its share of a call through."""
        self._check_open()
        if self._busy is not None:
            raise AuturiError(f"{call.describe()} while {self._busy} is running (from another thread): the envs are "
                              f"mid-step; call it between collects, once collect() has returned")
        source = self.env_fns[0]
        if getattr(source, "make_runner", None) is not None:
            raise AuturiError(no_env_objects_message(source))
        if call.changes:
            self._touched.update(call.ids)  # before the call: an env changed before another raised is changed too
        self._busy = call.describe()
        try:
            return self._call_envs(call)
        finally:
            self._busy = None

    def _env_indices(self, indices: Any) -> list[int]:
        """SB3's ``indices`` (None, an int, an iterable of ints; negative ones count from the
        end, as a list's) as local env indices."""
        n = self.num_envs
        if indices is None:
            return list(range(n))
        if isinstance(indices, (int, np.integer)):
            indices = [indices]
        out = []
        for i in indices:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise TypeError(f"env indices must be ints, got {i!r}")
            if not -n <= int(i) < n:
                raise IndexError(f"env index {int(i)} is out of range: this executor has {n} envs (0..{n - 1})")
            out.append(int(i) % n)
        return out

    def close(self) -> None:
        """End every worker and free every buffer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._close_workers()
        finally:
            if self._block is not None:
                self._block.close()
                self._block = None

    # ------------------------------------------------------- contract: the tuner's half
    def move_cost(self, config: Config, origin: Config | None = None) -> MoveCost:
        """What a reconfigure from ``origin`` (default: the current layout) to ``config``
        would start: processes, the servers they fork from that do not serve yet, and CUDA
        devices to initialise (:class:`~auturi.executor.contract.MoveCost`). Starts nothing;
        the tuner prices a move by it.

        >>> import auturi, gymnasium as gym
        >>> from auturi.envs import CountingEnv
        >>> with auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4,
        ...                           backend="serial") as ex:
        ...     cost = ex.move_cost(auturi.Config(num_actors=2, envs_per_actor=2))
        >>> cost.cold_servers, cost.devices   # a CPU policy, no server to start
        (0, 0)
        """
        origin = self.config if origin is None else origin
        if config == origin:
            return MoveCost()
        old, new = self._plan_for(origin), self._plan_for(config)
        started = self._processes_started(old, new)
        return MoveCost(len(started), self._cold_servers(config) if started else 0,
                        started_devices(started, old, new))

    def prepare(self, config: Config) -> None:
        """Get ready for a move to ``config`` ahead of it: start in the background what a
        reconfigure to it would wait for (``shm``: the forkservers its new processes fork
        from); :attr:`warming` says when that is done. Changes neither the layout nor any
        collect's data; idempotent; nothing where the backend has nothing to start ahead."""
        self._check_open()
        self._warm_for(config)

    @property
    def warming(self) -> bool:
        """Whether what :meth:`prepare` started is still starting: it shares the cores, so a
        collect timed meanwhile reads slow (the online tuner does not measure it)."""
        return False

    @property
    def last_num_steps(self) -> int:
        """Steps per env of the last collect (0 before the first): the training's collect
        length, which the tuner's profile reads."""
        return max(0, self._num_steps)

    # -- the tuner half's hooks (a backend with more to say overrides them)
    def _plan_for(self, config: Config) -> LayoutPlan:
        """``config``'s layout plan as this backend runs it (default: this machine's)."""
        return plan_layout(config)

    def _processes_started(self, old: LayoutPlan, new: LayoutPlan) -> tuple[ProcessPlan, ...]:
        """The processes a reconfigure from plan ``old`` to ``new`` starts (default: those
        with no live counterpart, :meth:`LayoutPlan.diff`)."""
        return old.diff(new).started

    def _cold_servers(self, config: Config) -> int:
        """Servers the processes of ``config`` fork from that do not serve yet (default: none)."""
        return 0

    def _warm_for(self, config: Config) -> None:
        """Start in the background what a reconfigure to ``config`` would wait for (default:
        nothing; see :meth:`prepare`)."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Dropped without close(), maybe as part of a reference cycle: the garbage collector
        # may have finalized its shared-memory blocks first (their mappings gone: a write there
        # was a segfault, 2026-11-26), so the backends end the workers by signals alone.
        self._finalizing = True
        try:
            self.close()
        except Exception:
            pass

    # ----------------------------------------------------------------- backend API
    @abc.abstractmethod
    def _apply_config(self, config: Config) -> None: ...

    @abc.abstractmethod
    def _run_actors(self, num_steps: int) -> tuple[float, float, float]:
        """Run every actor's loop; return (env, policy, wait) seconds of this collect."""

    @abc.abstractmethod
    def _gather_finals(self) -> dict[tuple[int, int], tuple[np.ndarray, dict]]: ...

    @abc.abstractmethod
    def _publish_weights(self, state: dict[str, np.ndarray], version: int) -> None: ...

    @abc.abstractmethod
    def _close_workers(self) -> None: ...

    def _call_envs(self, call: EnvCall) -> dict[int, Any]:
        """Run ``call`` on the live envs wherever they are; position in ``call.ids`` -> result.
        Raise the :class:`EnvCallError` of the first position whose env raised, once every
        process asked has answered."""
        raise NotImplementedError(f"the {self.backend} backend does not run env calls")

    def _refuse_lost_changes(self, config: Config) -> None:
        """Raise :class:`AuturiError` (changing nothing) if a reconfigure to ``config`` would
        recreate an env a call changed (``_touched``), where that is known beforehand
        (default: never; ``serial`` never moves an env)."""

    _shared_buffers = False

    def _on_new_block(self) -> None:
        """Called after the rollout block was (re)allocated."""

    # ------------------------------------------------------------------ shared parts
    def _check_open(self) -> None:
        if self._closed:
            raise AuturiError("this executor is closed (after close(), or after a worker failed); make a new one")

    def _prepare(self, num_steps: int) -> None:
        """Size the rollout block, carry the last row to row 0, and draw the noise."""
        if num_steps != self._num_steps:
            old = self._block
            self._block = ArrayBlock.create(self.spec.rollout_specs(num_steps, self.num_envs), self._shared_buffers)
            if old is not None:
                self._block["obs"][0] = old["obs"][self._num_steps]
                self._block["starts"][0] = old["starts"][self._num_steps]
                old.close()
            self._num_steps = num_steps
            self._on_new_block()
        else:
            b = self._block
            assert b is not None
            b["obs"][0] = b["obs"][num_steps]
            b["starts"][0] = b["starts"][num_steps]
        if self.spec.noise_dim:
            self._noise.fill(self._block["noise"], self.seed, self.env_id_offset, self._steps_done)

    def _build_rollout(self, finals: dict[tuple[int, int], tuple[np.ndarray, dict]]) -> Rollout:
        b = self._block
        assert b is not None
        T = self._num_steps
        off = self.env_id_offset
        if off:  # report ended episodes under their global env index
            finals = {(t, i + off): v for (t, i), v in finals.items()}
        return Rollout(
            observations=b["obs"][:T].copy(),
            actions=b["actions"].copy(),
            rewards=b["rewards"].copy(),
            terminated=b["terminated"].copy(),
            truncated=b["truncated"].copy(),
            episode_starts=b["starts"][:T].copy(),
            last_observations=b["obs"][T].copy(),
            last_episode_starts=b["starts"][T].copy(),
            extras={k[len("extras."):]: v.copy() for k, v in b.arrays.items() if k.startswith("extras.")},
            final_observations={k: v[0] for k, v in sorted(finals.items())},
            final_infos={k: v[1] for k, v in sorted(finals.items())},
        )


_NOTHING_DONE = {"seconds": 0.0, "kept": 0, "started": 0, "ended": 0, "moved": 0, "recreated": 0}


def _check_policy(policy: Any) -> None:
    """Refuse what cannot act before anything uses it: an object without ``act`` (``None``, a
    bare torch module), and a policy whose ``device`` names a CPU or CUDA device this machine
    lacks (torch would say only "Torch not compiled with CUDA enabled" from inside the probe)."""
    if not callable(getattr(policy, "act", None)):
        raise TypeError(f"policy must be an auturi Policy (an object with act(obs, noise)), got "
                        f"{type(policy).__name__}: wrap a torch module as auturi.TorchPolicy(model_fn, action_space), "
                        f"or use auturi.RandomPolicy(action_space)")
    device = getattr(policy, "device", None)
    if isinstance(device, str) and DEVICE_PATTERN.match(device):
        check_device(device, use_cpu=f"{type(policy).__name__}(..., device='cpu')")

