"""Results records, fingerprints, and the cache that lets a second run start at the known best."""
from __future__ import annotations

import functools
import json
import re

import gymnasium as gym
import pytest

import auturi
from auturi import Config
from auturi.envs import CountingEnv
from auturi.tuner import (
    OnlineTuner,
    ResultsCache,
    Tuner,
    TuneResult,
    hardware_fingerprint,
    load_record,
    resolve_cache_dir,
    workload_fingerprint,
)
from auturi.tuner.cache import (
    CACHE_ENV_VAR,
    describe_callable,
    fingerprint_key,
    save_record,
)
from tests.helpers import FakeExecutor

BEST = Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2)


def speeds(c: Config) -> float:
    return 3000.0 if c == BEST else 1000.0 + 10.0 * c.env_parallel_degree


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV_VAR, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_cache_dir() == tmp_path / "home" / ".cache" / "auturi"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_cache_dir() == tmp_path / "xdg" / "auturi"
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "env"))
    assert resolve_cache_dir() == tmp_path / "env"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert ResultsCache().directory == tmp_path / "env"


def test_hardware_fingerprint_names_the_machine():
    hw = hardware_fingerprint()
    assert {"cpu_model", "cores", "memory_gib", "gpus", "torch", "platform"} <= set(hw)
    assert hw["cores"] >= 1 and isinstance(hw["gpus"], list) and hw["torch"]
    assert hardware_fingerprint() == hw  # stable within a machine
    json.dumps(hw)


def test_workload_fingerprint_is_stable_and_tells_workloads_apart():
    policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    with auturi.make_executor(CountingEnv, policy, 4, backend="serial") as a, \
            auturi.make_executor(CountingEnv, policy, 4, backend="serial", seed=7) as b, \
            auturi.make_executor(CountingEnv, policy, 2, backend="serial") as c:
        fa = workload_fingerprint(a, 16)
        assert fa == workload_fingerprint(b, 16)  # the seed does not change the best layout
        assert fa["env"] == "auturi.envs.testing.CountingEnv" and fa["num_envs"] == 4 and fa["num_steps"] == 16
        assert fa["policy"]["class"] == "auturi.policy.RandomPolicy"
        assert "Discrete(3)" in fa["action_space"] and "Box" in fa["observation_space"]
        assert fa != workload_fingerprint(c, 16)
        assert fa != workload_fingerprint(a, 32)
        assert workload_fingerprint(a, 16, {"workload": "x"})["workload"] == "x"
        json.dumps(fa)


def test_describe_callable_has_no_addresses():
    assert describe_callable(CountingEnv) == "auturi.envs.testing.CountingEnv"
    d = describe_callable(functools.partial(CountingEnv, max_len=5))
    assert d == "auturi.envs.testing.CountingEnv(max_len=5)"
    assert " at 0x" not in describe_callable(lambda: None)

    class Maker:
        def __call__(self):
            return None

    class Named(Maker):
        def __repr__(self):
            return "Named('Pong-v5')"

    assert describe_callable(Maker()).endswith("Maker")  # default repr: the class, no address
    assert describe_callable(Named()).endswith("Named('Pong-v5')")  # tells tasks apart


def test_record_round_trips_through_json(tmp_path):
    ex = FakeExecutor(8, speeds, noise=0.02)
    result = Tuner("grid", budget_trials=4, cache=False, clock=ex.clock, workload={"name": "fake"}).tune(ex, 16)
    path = result.save(tmp_path / "run.json")
    rec = load_record(path)
    assert rec["schema"] == 1 and rec["workload"]["name"] == "fake" and rec["hardware"]["cores"] >= 1
    assert rec["choice"]["config"] == result.choice.to_dict() and rec["choice"]["why"] == result.reason
    assert len(rec["trials"]) == 4
    for t, saved in zip(result.trials, rec["trials"]):
        assert saved["samples"] == t.samples and saved["warmup"] == t.warmup  # every sample kept
    back = TuneResult.load(path)
    assert back.choice == result.choice and back.start == result.start
    assert [t.config for t in back.trials] == [t.config for t in result.trials]
    assert back.throughput == pytest.approx(result.throughput)


def test_cache_store_load_and_corrupt_file(tmp_path):
    cache = ResultsCache(tmp_path)
    hw, wl = {"cpu_model": "x", "cores": 2}, {"env": "e", "num_envs": 4}
    assert cache.load(hw, wl) is None
    cache.store({"hardware": hw, "workload": wl, "choice": {"config": BEST.to_dict(), "throughput": 5.0}})
    assert cache.best(hw, wl) == (BEST, 5.0)
    assert cache.load(hw, {**wl, "num_envs": 8}) is None  # another workload: another key
    assert cache.path(hw, wl).name == fingerprint_key(hw, wl) + ".json"
    cache.path(hw, wl).write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert cache.load(hw, wl) is None
    with pytest.raises(ValueError, match="hardware"):
        cache.store({"choice": {}})
    assert cache.clear() == 1


GOOD_TRIAL = {"config": BEST.to_dict(), "samples": [1.0, 2], "warmup": [], "status": "ok", "error": None}
# Cache records broken at each level: (what is wrong, the fields replaced, what the warning names).
MALFORMED = [
    ("choice a string (the issue's case)", {"choice": "nonsense"}, "choice must be a JSON object"),
    ("choice a list", {"choice": [BEST.to_dict()]}, "choice must be a JSON object"),
    ("no choice", {"choice": None}, "choice must be"),
    ("choice without a config", {"choice": {"throughput": 5.0}}, "choice.config is missing"),
    ("config a string", {"choice": {"config": "nonsense"}}, "choice.config must be a JSON object"),
    ("config with a bad knob", {"choice": {"config": {"num_actors": "many"}}}, "choice.config is not a valid"),
    ("config with an unknown knob", {"choice": {"config": {"warp": 9}}}, "choice.config is not a valid"),
    ("throughput a string", {"choice": {"config": BEST.to_dict(), "throughput": "fast"}},
     "choice.throughput must be a number"),
    ("why a number", {"choice": {"config": BEST.to_dict(), "why": 3}}, "choice.why must be a string"),
    ("no hardware", {"hardware": None}, "hardware must be"),
    ("workload a list", {"workload": ["e"]}, "workload must be a JSON object"),
    ("start a string", {"start": "serial"}, "start must be a JSON object"),
    ("num_steps a float", {"num_steps": 16.5}, "num_steps must be an integer"),
    ("cache_hit a string", {"cache_hit": "yes"}, "cache_hit must be true or false"),
    ("startup a number", {"startup": 1.5}, "startup must be a JSON object"),
    ("trials an object", {"trials": {"0": GOOD_TRIAL}}, "trials must be a JSON list"),
    ("a trial a list", {"trials": [GOOD_TRIAL, [1, 2]]}, "trials[1] must be a JSON object"),
    ("a trial without config", {"trials": [{"samples": [1.0]}]}, "trials[0].config is missing"),
    ("a sample a string", {"trials": [{**GOOD_TRIAL, "samples": [1.0, "2"]}]}, "trials[0].samples[1] must be"),
    ("a sample a bool", {"final": [{**GOOD_TRIAL, "samples": [True]}]}, "final[0].samples[0] must be"),
    ("samples a number", {"trials": [{**GOOD_TRIAL, "samples": 3.0}]}, "trials[0].samples must be a JSON list"),
    ("a final trial's error a number", {"final": [{**GOOD_TRIAL, "error": 3}]}, "final[0].error must be"),
    ("a trial's config a list", {"trials": [{**GOOD_TRIAL, "config": [1]}]}, "trials[0].config must be"),
]


def test_malformed_cache_records_are_skipped_with_a_warning_naming_the_file(tmp_path):
    cache = ResultsCache(tmp_path)
    hw = {"cpu_model": "x", "cores": 2}
    good_wl = {"env": "good", "num_envs": 4}
    cache.store({"hardware": hw, "workload": good_wl, "choice": {"config": BEST.to_dict(), "throughput": 5.0},
                 "trials": [GOOD_TRIAL], "final": [{**GOOD_TRIAL, "predicted": None}], "start": BEST.to_dict()})
    cases = [(what, i, {"hardware": hw, "workload": {"env": f"bad{i}", "num_envs": 4},
                        "choice": {"config": BEST.to_dict()}, **fields}, names)
             for i, (what, fields, names) in enumerate(MALFORMED)]
    cases += [("the record a list", len(cases), ["choice", "nonsense"], "the record must be a JSON object"),
              ("no workload", len(cases) + 1, {"hardware": hw, "choice": {"config": BEST.to_dict()}},
               "workload is missing")]
    for what, i, rec, names in cases:
        wl = {"env": f"bad{i}", "num_envs": 4}  # the key the file is filed under, whatever it holds
        cache.path(hw, wl).write_text(json.dumps(rec))
        with pytest.warns(UserWarning) as caught:
            assert cache.load(hw, wl) is None, what
            assert cache.best(hw, wl) is None, what
        message = str(caught[0].message)
        assert str(cache.path(hw, wl)) in message and names in message and "delete it" in message, (what, message)
    assert cache.best(hw, good_wl) == (BEST, 5.0)  # the good record beside them still loads
    assert len(list(tmp_path.glob("*.json"))) == len(cases) + 1


def test_load_record_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"choice": {"config": BEST.to_dict()}, "start": BEST.to_dict(),
                                "trials": [GOOD_TRIAL, {**GOOD_TRIAL, "samples": [1.0, "x"]}]}))
    with pytest.raises(ValueError, match=r"run\.json is not a valid Auturi results record: trials\[1\]\.samples\[1\]"):
        TuneResult.load(path)
    path.write_text(json.dumps({"choice": {"config": BEST.to_dict()}, "start": BEST.to_dict(), "trials": [GOOD_TRIAL]}))
    assert TuneResult.load(path).trials[0].samples == [1.0, 2]


def test_a_corrupted_cache_record_does_not_break_the_next_run(tmp_path):
    ex1 = FakeExecutor(8, speeds, noise=0.02, seed=1)
    Tuner("grid", cache=tmp_path, clock=ex1.clock).tune(ex1, 16)
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "choice": "nonsense"}))
    ex2 = FakeExecutor(8, speeds, noise=0.02, seed=2)
    with pytest.warns(UserWarning, match=re.escape(str(path))):
        second = Tuner("grid", cache=tmp_path, clock=ex2.clock).tune(ex2, 16)
    assert not second.cache_hit and second.choice == BEST  # searched afresh
    assert load_record(path)["choice"]["config"] == BEST.to_dict()  # and the file was rewritten whole


def test_save_record_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        save_record({"x": float("nan")}, tmp_path / "r.json")
    assert not list(tmp_path.iterdir())  # no half-written file left behind


def test_second_run_starts_at_the_cached_best_and_stops_early(tmp_path):
    ex1 = FakeExecutor(8, speeds, noise=0.02, seed=1)
    first = Tuner("grid", cache=tmp_path, clock=ex1.clock).tune(ex1, 16)
    assert first.choice == BEST and not first.cache_hit
    assert len(list(tmp_path.glob("*.json"))) == 1

    ex2 = FakeExecutor(8, speeds, noise=0.02, seed=2)  # a fresh executor, back at serial
    events = []
    second = Tuner("grid", cache=tmp_path, clock=ex2.clock, callback=events.append).tune(ex2, 16)
    assert second.cache_hit
    assert second.trials[0].source == "cache" and second.trials[0].config == BEST  # measured first
    assert [t.source for t in second.trials] == ["cache", "start"]  # start is serial here
    assert "confirmed" in second.reason
    assert second.choice == BEST and ex2.config == BEST
    assert "search" not in [e.message for e in events if e.kind == "phase"]
    assert ex2.collects < ex1.collects / 5


def test_a_cached_choice_that_got_slower_is_not_trusted(tmp_path):
    ex1 = FakeExecutor(8, speeds, noise=0.02, seed=1)
    Tuner("grid", cache=tmp_path, clock=ex1.clock).tune(ex1, 16)
    ex2 = FakeExecutor(8, speeds, noise=0.02, seed=2)
    ex2.slowdown[BEST] = 0.3  # the machine changed in a way the fingerprint missed
    second = Tuner("grid", cache=tmp_path, clock=ex2.clock).tune(ex2, 16)
    assert second.cache_hit and "not confirmed" in second.reason
    assert any(t.source == "search" for t in second.trials)
    assert second.choice != BEST


def test_online_tuner_uses_and_fills_the_cache(tmp_path):
    ex1 = FakeExecutor(8, speeds, noise=0.01, seed=1)
    first = Tuner("grid", cache=tmp_path, clock=ex1.clock).tune(ex1, 16)
    assert first.choice == BEST
    ex2 = FakeExecutor(8, speeds, noise=0.01, seed=2)
    online = OnlineTuner(ex2, "grid", budget_trials=3, cache=tmp_path, clock=ex2.clock, min_samples=2)
    online.collect(16)
    assert ex2.config == BEST  # switched to the cached best before its first collect
    while online.phase != "locked":
        online.collect(16)
    assert online.history[0].source == "cache" and online.locked_config == BEST


def test_envpool_sources_are_named_by_task_not_module():
    """A cache key must not change when the EnvPool source's class moves between modules."""
    pytest.importorskip("envpool")
    from auturi.envs.envpool import EnvPoolSource

    assert describe_callable(EnvPoolSource("CartPole-v1")) == "envpool:EnvPoolSource('CartPole-v1')"


# ---------------------------------------------------------------------------- a cache that cannot be used
# The cache is an optimisation: nothing it fails at may stop a run. These tests make the
# failures without chmod (a test run as root writes through any mode): a cache directory
# under a regular file, or os functions patched to fail as a full or read-only disk does.
import errno  # noqa: E402
import os  # noqa: E402

from auturi.tuner import cache as cache_mod  # noqa: E402
from auturi.tuner.cache import CacheWarning  # noqa: E402

HW, WL = {"cpu_model": "x", "cores": 2}, {"env": "e", "num_envs": 8}


def record(config: Config = BEST, throughput: float = 5.0) -> dict:
    return {"hardware": HW, "workload": WL, "choice": {"config": config.to_dict(), "throughput": throughput}}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts as a fresh process would: no directory warned about yet."""
    monkeypatch.setattr(cache_mod, "_warned_dirs", set())


def cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-"))


def test_an_unwritable_cache_directory_is_one_warning_and_the_tuning_goes_on(tmp_path):
    (tmp_path / "a_file").write_text("")
    where = tmp_path / "a_file" / "cache"  # mkdir fails with ENOTDIR, as root too
    with pytest.warns(CacheWarning) as caught:
        ex1 = FakeExecutor(8, speeds, noise=0.02, seed=1)
        first = Tuner("grid", cache=where, clock=ex1.clock).tune(ex1, 16)
        ex2 = FakeExecutor(8, speeds, noise=0.02, seed=2)
        second = Tuner("grid", cache=where, clock=ex2.clock).tune(ex2, 16)  # the same process, the same directory
    assert first.choice == second.choice == BEST and not second.cache_hit
    (message,) = cache_warnings(caught)  # one warning for both runs' stores
    assert str(where) in message and "cannot be written" in message
    assert f"{CACHE_ENV_VAR}=" in message and "--no-cache" in message and "cache=False" in message


def test_the_online_tuner_locks_in_with_an_unwritable_cache(tmp_path):
    """The issue's SB3 case: learn() raised PermissionError when the tuner locked in (it
    stores its choice then)."""
    (tmp_path / "a_file").write_text("")
    ex = FakeExecutor(8, speeds, noise=0.01, seed=1)
    online = OnlineTuner(ex, "grid", budget_trials=3, cache=tmp_path / "a_file" / "c", clock=ex.clock, min_samples=2)
    with pytest.warns(CacheWarning, match="cannot be written"):
        for _ in range(200):
            online.collect(16)
            if online.phase == "locked":
                break
    assert online.phase == "locked" and online.locked_config is not None


def failing(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


@pytest.mark.parametrize("where,error", [
    ("fsync", OSError(errno.ENOSPC, "No space left on device")),
    ("replace", OSError(errno.EROFS, "Read-only file system")),
    ("replace", PermissionError(errno.EACCES, "Permission denied")),
    ("open", OSError(errno.EDQUOT, "Disk quota exceeded")),
], ids=["full-disk", "read-only", "permission", "quota"])
def test_a_store_that_fails_warns_once_and_leaves_nothing_behind(tmp_path, monkeypatch, where, error):
    cache = ResultsCache(tmp_path)
    with monkeypatch.context() as m, pytest.warns(CacheWarning) as caught:
        m.setattr(os, where, failing(error))
        assert cache.store(record()) is None
        assert cache.store(record()) is None  # the second failure in this process is silent
    (message,) = cache_warnings(caught)
    assert str(tmp_path) in message and error.strerror in message and CACHE_ENV_VAR in message
    assert list(tmp_path.iterdir()) == []  # no temporary file, no half record


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_an_interrupted_store_leaves_no_temporary_file_and_the_old_record(tmp_path, monkeypatch, where):
    cache = ResultsCache(tmp_path)
    cache.store(record(BEST))
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(os, where, failing(KeyboardInterrupt()))
        cache.store(record(Config.serial(8)))  # Ctrl-C mid-store
    assert leftovers(tmp_path) == []
    assert cache.best(HW, WL) == (BEST, 5.0)  # the record before is whole


def test_stale_temporary_files_of_killed_stores_are_swept(tmp_path):
    stale, fresh = tmp_path / ".tmp-1-aaaa.json", tmp_path / ".tmp-2-bbbb.json"
    stale.write_text("{")
    fresh.write_text("{")  # could be another process's store under way: kept
    old = stale.stat().st_mtime - 2 * ResultsCache.STALE_TMP_SECONDS
    os.utime(stale, (old, old))
    ResultsCache(tmp_path).store(record())
    assert leftovers(tmp_path) == [fresh.name]


def test_an_unreadable_cache_directory_is_a_warning_not_a_crash(tmp_path, monkeypatch):
    cache = ResultsCache(tmp_path)
    cache.store(record())
    with monkeypatch.context() as m, pytest.warns(CacheWarning) as caught:
        m.setattr(cache_mod, "open", failing(PermissionError(errno.EACCES, "Permission denied")), raising=False)
        assert cache.load(HW, WL) is None
        assert cache.best(HW, WL) is None
    (message,) = cache_warnings(caught)
    assert str(tmp_path) in message and "cannot be read" in message and "Permission denied" in message
    (tmp_path / "a_file").write_text("")
    assert ResultsCache(tmp_path / "a_file" / "c").load(HW, WL) is None  # a path under a file: nothing cached


def test_a_record_another_user_owns_is_not_trusted(tmp_path, monkeypatch):
    """A planted record (written by someone else into a directory they can write) must not
    choose what this run measures first."""
    planted = Config(num_actors=4, envs_per_actor=2)
    ex1 = FakeExecutor(8, speeds, noise=0.02, seed=1)
    Tuner("grid", cache=tmp_path, clock=ex1.clock).tune(ex1, 16)
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    rec["choice"] = {"config": planted.to_dict(), "throughput": 1e9}
    path.write_text(json.dumps(rec))
    assert ResultsCache(tmp_path).best(rec["hardware"], rec["workload"])[0] == planted  # ours: trusted

    monkeypatch.setattr(os, "getuid", lambda: path.stat().st_uid + 1)  # the file is now someone else's
    ex2 = FakeExecutor(8, speeds, noise=0.02, seed=2)
    with pytest.warns(CacheWarning, match=r"belongs to user id \d+, not to you") as caught:
        second = Tuner("grid", cache=tmp_path, clock=ex2.clock).tune(ex2, 16)
    assert str(path) in cache_warnings(caught)[0]
    assert not second.cache_hit and second.trials[0].source != "cache" and second.trials[0].config != planted
    assert second.choice == BEST
