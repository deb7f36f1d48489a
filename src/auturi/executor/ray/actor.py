"""The actor side of the ``ray`` backend: :class:`RayActorHost`, the body of one Ray actor,
running a :class:`SliceExecutor` (a one-actor ``shm`` executor over its slice of the envs)
on its node."""
from __future__ import annotations

import os
import signal
from typing import Any, Sequence

from auturi.config import Config
from auturi.errors import AuturiError
from auturi.executor.env_calls import answer_env_call
from auturi.executor.shm import ShmExecutor
from auturi.executor.shm.channel import BEAT, process_stack
from auturi.resources import usable_cores_set


class SliceExecutor(ShmExecutor):
    """A ``shm`` executor over a slice of a larger collection: its envs are the global envs
    ``env_id_offset ..``, its first layout starts at env generation ``generation`` and its
    noise streams at ``steps_done`` steps, so it runs exactly as its envs would inside the
    whole after that many steps and reconfigures."""

    def __init__(self, *args: Any, generation: int = 0, steps_done: int = 0, **kwargs: Any):
        self._first_generation = generation
        super().__init__(*args, **kwargs)
        self._steps_done = steps_done

    def _apply_config(self, config: Config) -> None:
        if self._plan is None:
            self._generation = self._first_generation - 1  # the first layout adds one
        super()._apply_config(config)

    def reconfigure_at(self, config: Config, generation: int) -> dict[str, Any]:
        """:meth:`reconfigure` to ``config``, envs it recreates made from env generation
        ``generation`` on (the whole collection's: another actor may have recreated envs since
        this one last did); returns ``last_reconfigure`` and the generation it ends at."""
        self._generation = generation
        self.reconfigure(config)
        return {**self.last_reconfigure, "generation": self._generation}

    def progress_word(self) -> int:
        """This executor's progress word (bumped per row stepped and while it waits on a worker
        of its own, which it watches itself); -1 before its first layout or once closed."""
        ctrl = self._ctrl
        return -1 if ctrl is None else int(ctrl["hdr"][BEAT])

    def kill_workers(self) -> None:
        """SIGKILL every worker process (from another thread, while a collect may be
        waiting on them: that collect then fails, and the executor closes itself)."""
        for s in self._slots:
            if s.proc is not None and s.proc.pid is not None:
                try:
                    os.kill(s.proc.pid, signal.SIGKILL)
                except OSError:  # already gone
                    pass


class RayActorHost:
    """The body of one Ray actor: a :class:`SliceExecutor` over its envs, on its node."""

    def __init__(self) -> None:
        from auturi.executor.shm.worker import register_stack_dump

        self.ex: SliceExecutor | None = None
        self.dumpfd = register_stack_dump()  # read by whoever finds this actor stuck

    def progress(self) -> int:
        """Runs in the ``control`` thread: this actor's progress word (rows stepped, waits;
        it also moves while the actor waits on a worker of its own, which it watches itself).
        A stopped actor, or one stuck in C code holding the GIL, does not answer."""
        ex = self.ex
        return -1 if ex is None else ex.progress_word()

    def where(self) -> dict[str, Any]:
        import ray

        cores = sorted(usable_cores_set())
        return {"node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "cores": cores, "dumpfd": self.dumpfd}

    def start(self, env_fns: Sequence[Any], policy: Any, config: Config, seed: int, lo: int, generation: int,
              steps_done: int, weights: dict | None, cores: list[int] | None, worker_timeout: float,
              check_finite: bool = False) -> None:
        if cores:  # this actor's own cores of its node (when the node has enough for every actor)
            try:
                os.sched_setaffinity(0, cores)
            except (AttributeError, OSError):
                pass
        self.ex = SliceExecutor(list(env_fns[lo:lo + config.num_envs]), policy, config=config, seed=seed,
                                env_id_offset=lo, generation=generation, steps_done=steps_done,
                                worker_timeout=worker_timeout, check_finite=check_finite)
        if weights is not None:
            self.ex.set_policy_state(weights)

    def collect(self, num_steps: int) -> Any:
        assert self.ex is not None
        return self.ex.collect(num_steps)  # on an error it closes itself, then raises

    def reconfigure(self, config: Config, generation: int) -> dict[str, Any]:
        """Change this actor's own layout in place (the caller kept this Ray actor)."""
        assert self.ex is not None
        return self.ex.reconfigure_at(config, generation)

    def set_policy_state(self, state: dict) -> None:
        assert self.ex is not None
        self.ex.set_policy_state(state)

    def env_call(self, request: bytes) -> bytes:
        """Run a pickled :class:`~auturi.executor.env_calls.EnvCall` on this actor's envs
        (its ids local to this actor's executor) and return the pickled answer (results, or
        the exception: an env's is an ``EnvCallError`` naming the global env)."""
        assert self.ex is not None
        return answer_env_call(self.ex.run_env_call, request)

    def check_moves(self, config: Config) -> AuturiError | None:
        """The ``LostEnvChangesError`` a reconfigure of this actor's executor to ``config``
        would raise (None: it would lose nothing an env call changed); changes nothing."""
        ex = self.ex
        if ex is None or not ex._touched or ex._config is None or config == ex._config:
            return None
        try:
            ex._refuse_lost_changes(config)
        except AuturiError as e:
            return e
        return None

    def abort(self) -> None:
        """Runs in the actor's ``control`` thread, beside a running collect: end this actor's
        worker processes so the collect fails and its executor closes (unlinking its shared
        memory) instead of waiting for workers that may never answer."""
        ex = self.ex
        if ex is not None:
            ex.kill_workers()

    def child_pids(self) -> list[int]:
        """Pids of the processes this actor started (for tests and debugging)."""
        import psutil

        return [p.pid for p in psutil.Process().children(recursive=True)]

    def close(self) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.close()  # unlinks its segments and semaphore names itself: the caller ray.kill()s us next

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_remote_cls: Any = None


def actor_class() -> Any:
    """:class:`RayActorHost` as a Ray actor class (made once, when first needed: Ray is imported here)."""
    global _remote_cls
    if _remote_cls is None:
        import ray

        # "control": a second thread for abort(), beside the default one that runs collects
        _remote_cls = ray.remote(max_restarts=0, max_task_retries=0, concurrency_groups={"control": 1})(RayActorHost)
    return _remote_cls


def stack_of(pid: int, fd: int) -> tuple[str, str]:
    """:func:`channel.process_stack` of a Ray actor (runs on its node)."""
    return process_stack(pid, fd)
