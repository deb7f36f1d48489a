"""Calls on the live envs through the executor (``env_method``, ``get_attr``, ``set_attr``,
``env_call``; 2026-11-26): SB3's ``indices``, errors that name the env and the call, what is
refused (a call during a collect, vector-env sources), and what a reconfigure does with an
env a call changed. The data contract with such calls (every layout gives the serial rollout
and answers, Ray included) is in ``test_executor_contract.py`` (``curriculum``)."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from auturi import AuturiError, Config, make_executor
from auturi.errors import LostEnvChangesError
from auturi.errors import EnvCallError
from tests.env_call_envs import LevelEnv, RebuiltLevelEnv, UnpicklableLevelEnv
from tests.helpers import ObsHashPolicy


def executor(config, env_fn=LevelEnv, backend=None, **kw):
    return make_executor(env_fn, ObsHashPolicy(LevelEnv().action_space), num_envs=4, config=config,
                         backend=backend or ("serial" if config == Config.serial(4) else "shm"), seed=1, **kw)


def test_indices_are_sb3s_and_answers_come_in_their_order():
    with executor(Config.serial(4)) as ex:
        assert ex.env_method("set_level", 5, indices=2) == [5]
        assert ex.env_method("set_level", level=6, indices=[-1, 0]) == [6, 6]  # kwargs, negative index
        assert ex.get_attr("level") == [6, 0, 5, 6]
        assert ex.get_attr("level", [2, 2, 1]) == [5, 5, 0]  # repeats, positional indices
        assert ex.set_attr("level", 7, indices=range(1, 3)) is None
        assert ex.env_call("get", "level") == [6, 7, 7, 6]
        assert ex.get_attr("level", indices=np.int64(1)) == [7]
        with pytest.raises(IndexError, match="env index 4 is out of range: this executor has 4 envs"):
            ex.get_attr("level", indices=[0, 4])
        with pytest.raises(TypeError, match="env indices must be ints"):
            ex.get_attr("level", indices=["0"])
        with pytest.raises(ValueError, match="kind must be one of"):
            ex.env_call("call", "level")
        # a wrapper's attribute is read through it, as DummyVecEnv's get_wrapper_attr does
        assert ex.get_attr("max_len") == [12] * 4


@pytest.mark.parametrize("where", ["serial", "env worker", "actor process"])
def test_an_env_that_raises_is_named_with_the_call_and_the_executor_goes_on(where):
    """The env that comes first in ``indices`` names the error (env 3 here, before env 1 that
    raises too), wherever it runs; its own exception is the cause, with the worker's
    traceback; the executor goes on collecting."""
    config = {"serial": Config.serial(4), "env worker": Config(1, 4, 2), "actor process": Config(2, 2)}[where]
    with executor(config) as ex:
        ex.collect(3)
        with pytest.raises(EnvCallError, match=r"env 3: env_method\('fail'\) raised ValueError: boom") as info:
            ex.env_method("fail", "boom", indices=[3, 1])
        assert info.value.env_id == 3 and isinstance(info.value.__cause__, ValueError)
        assert str(info.value.__cause__) == "boom"
        if where != "serial":  # env 3 is in another process: its traceback came along
            assert "in fail" in "".join(getattr(info.value.__cause__, "__notes__", []))
        # the cause keeps its type (the SB3 face raises an AttributeError as one)
        assert isinstance(ex_cause(ex, "no_such_method"), AttributeError)
        pids = ex.env_method("pid")
        assert (pids[3] != os.getpid()) == (where != "serial")  # the call ran where env 3 steps
        assert ex.collect(3).rewards.shape == (3, 4)


def ex_cause(ex, name):
    try:
        ex.env_method(name, indices=[2])
    except EnvCallError as e:
        assert e.env_id == 2 and f"env_method({name!r})" in str(e)
        return e.__cause__
    raise AssertionError("no error")


def test_a_result_that_cannot_come_back_from_a_worker_is_an_error_and_the_executor_goes_on():
    with executor(Config(1, 4, 2)) as ex:
        with pytest.raises(AuturiError, match=r"env_method\('unpicklable_result'\) returned a value that cannot be "
                                              r"pickled"):
            ex.env_method("unpicklable_result", indices=[3])
        assert ex.get_attr("level") == [0] * 4


def test_a_call_while_a_collect_runs_is_refused():
    """From another thread, while env 0 is inside its step: refused, naming why; the collect
    is not disturbed."""
    entered, release = threading.Event(), threading.Event()

    class Blocking(LevelEnv):
        def step(self, action):
            if self.steps == 1 and not release.is_set():
                entered.set()
                release.wait()
            return super().step(action)

    errors = []

    def call():
        entered.wait()
        try:
            ex.get_attr("level")
        except AuturiError as e:
            errors.append(e)
        finally:
            release.set()

    with executor(Config.serial(4), env_fn=Blocking) as ex:
        thread = threading.Thread(target=call)
        thread.start()
        ex.collect(3)
        thread.join()
        assert len(errors) == 1 and "get_attr('level') while a collect is running" in str(errors[0])
        assert ex.get_attr("steps") == [3] * 4  # between collects it answers


def test_vector_env_sources_have_no_env_objects_to_call():
    """EnvPool and ale-py's AtariVectorEnv runners have no Python env per env: refused with why."""
    from auturi.envs import CountingEnv

    class VectorSource:  # what the executor knows a vector-env source by: make_runner
        def __call__(self):
            return CountingEnv()

        def make_runner(self, *args):
            raise AssertionError("not built: the serial layout's runner is made lazily")

        def __repr__(self):
            return "vector:Counting"

    with executor(Config.serial(4)) as ex:
        ex.env_fns = [VectorSource()] * 4  # as resolve_env_fns gives a vector source's
        with pytest.raises(AuturiError, match=r"VectorSource \(vector:Counting\) has none: its envs live inside one "
                                              r"vectorised C\+\+ env"):
            ex.env_method("set_level", 1)


# ------------------------------------------------------------- changed envs and reconfigure
def test_a_changed_env_not_reset_yet_moves_with_its_change():
    """Made anew in its new process, an env not reset yet would lose what a call set on it:
    it travels as it is and is reset there (the data is the serial run's, test_executor_contract's
    ``curriculum``); here: into actor processes (pickled) and back to the caller."""
    with executor(Config.serial(4), backend="shm") as ex:
        ex.env_method("set_level", 10, indices=[1])
        ex.reconfigure(Config(4, 1))
        assert ex.last_reconfigure["recreated"] == 0
        assert (ex.collect(3).rewards[:, 1] >= 10).all()
        ex.reconfigure(Config.serial(4))
        assert ex.get_attr("level") == [0, 10, 0, 0]


def test_an_env_that_cannot_be_pickled_keeps_its_change_or_the_reconfigure_is_refused():
    """Envs that never pickle are recreated when they change process: for an env a call
    changed that would drop the change, so such a reconfigure is refused before anything
    changes (the executor goes on in its layout, changes intact); one that keeps the changed
    env in its process (the caller's here) goes ahead."""
    with executor(Config(1, 4, 2), env_fn=UnpicklableLevelEnv) as ex:
        assert not ex.envs_movable
        ex.collect(3)
        ex.env_method("set_level", 10, indices=[0])
        ex.reconfigure(Config(1, 4, 4))  # env 0 stays in the caller; env 1 is recreated (unchanged)
        assert ex.last_reconfigure["recreated"] == 3
        with pytest.raises(LostEnvChangesError, match=r"would recreate env\(s\) \[0\].*it cannot be "
                                                      r"pickled") as info:
            ex.reconfigure(Config(4, 1))  # env 0 into an actor process
        assert info.value.envs == [0] and info.value.intact
        assert ex.config == Config(1, 4, 4)
        assert (ex.collect(3).rewards[:, 0] >= 10).all()
        assert ex.get_attr("level") == [10, 0, 0, 0]


def test_a_call_that_leaves_an_env_unpicklable_keeps_it_where_it_is():
    """The round trip after the call fails: a move of that env is refused beforehand."""
    with executor(Config(1, 4, 2)) as ex:
        ex.collect(3)
        ex.env_method("hold_a_lock", indices=[3])
        ex.reconfigure(Config(1, 4, 2, 1, "cpu", 2))  # a batch change: nothing moves
        with pytest.raises(LostEnvChangesError, match=r"would recreate env\(s\) \[3\].*did not keep them") as info:
            ex.reconfigure(Config(4, 1))
        assert info.value.intact and ex.collect(3).rewards.shape == (3, 4)


def test_an_env_that_stops_pickling_after_a_call_changed_it_fails_the_reconfigure_that_moves_it():
    """Found only when it has to move (it took a lock while stepping, after the call): the
    reconfigure raises, naming the env, and the executor closes, as after any failed
    reconfigure; nothing leaks."""
    with executor(Config(1, 4, 2)) as ex:
        ex.collect(3)
        ex.set_attr("lock_at", 5, indices=[3])  # pickles whole now; takes its lock at step 5
        ex.collect(3)
        with pytest.raises(LostEnvChangesError, match=r"would recreate env\(s\) \[3\].*could not be pickled "
                                                      r"when they had to move") as info:
            ex.reconfigure(Config(4, 1))
        assert info.value.envs == [3] and not info.value.intact
        with pytest.raises(AuturiError, match="this executor is closed"):
            ex.collect(3)


def test_an_unpicklable_env_that_a_call_only_read_moves_as_before():
    """``get_attr`` changes nothing: a reconfigure recreates such envs as it always did."""
    with executor(Config(1, 4, 2), env_fn=UnpicklableLevelEnv) as ex:
        ex.collect(3)
        assert ex.get_attr("level") == [0] * 4
        ex.reconfigure(Config(4, 1))
        assert ex.last_reconfigure["recreated"] == 4


def test_an_env_whose_pickle_drops_a_change_is_not_moved():
    """An env that pickles by re-running its constructor (``EzPickle``: gymnasium's MuJoCo
    envs) loses its state in a copy: the probe finds that (a copy steps differently), so its
    envs are recreated rather than moved, and a move that would lose what a call set is refused
    before anything changes (the executor goes on in its layout)."""
    with executor(Config(1, 4, 2), env_fn=RebuiltLevelEnv) as ex:
        assert not ex.envs_movable
        ex.collect(3)
        ex.env_method("set_level", 10, indices=[3])  # env 3: in the env worker
        with pytest.raises(LostEnvChangesError, match=r"would recreate env\(s\) \[3\].*a copy steps differently") as info:
            ex.reconfigure(Config(4, 1))
        assert info.value.intact and ex.config == Config(1, 4, 2)
        assert (ex.collect(3).rewards[:, 3] >= 10).all()
        ex.set_attr("level", 0, indices=[3])  # undone, but a copy still loses its state (its step count)
        with pytest.raises(LostEnvChangesError, match=r"\[3\]"):
            ex.reconfigure(Config(4, 1))
        assert ex.get_attr("steps") == [6] * 4 and ex.get_attr("level") == [0] * 4
