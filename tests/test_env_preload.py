"""Env workers start with the modules their env factories need already imported: the env
forkserver preloads them (a worker that imported SB3's Monitor itself paid 1.4 s per start)."""
import functools
import os
import time

import pytest

from auturi.executor.shm.forkservers import modules_to_preload
from tests.helpers import run_probe_script


def test_the_modules_a_factory_names_are_found():
    from tests.preload_probe import PreloadProbeEnv

    mods = modules_to_preload(functools.partial(PreloadProbeEnv, "/tmp"))
    assert "tests.preload_probe" in mods
    assert not any(m.split(".")[0] in ("builtins", "__main__") for m in mods)
    assert modules_to_preload(lambda: None) == ()  # a closure from __main__ travels by value
    # The standard library and what every worker preloads do not make a server of their own.
    from auturi.envs import CountingEnv

    assert modules_to_preload(functools.partial(CountingEnv)) == ()


def test_env_workers_fork_with_the_factories_modules_imported(tmp_path):
    main, workers = run_probe_script(tmp_path, """
        import functools, os, sys
        from auturi import Config, make_executor
        from auturi.policy import RandomPolicy
        from tests.preload_probe import PreloadProbeEnv

        if __name__ == "__main__":
            env_fn = functools.partial(PreloadProbeEnv, sys.argv[1])
            ex = make_executor(env_fn, RandomPolicy(env_fn().action_space), num_envs=4,
                               config=Config(envs_per_actor=4, env_parallel_degree=4), backend="shm")
            ex.collect(2)
            ex.close()
            print(os.getpid(), flush=True)
    """)
    assert main == "1" and len(workers) == 3
    assert set(workers.values()) == {"0"}, workers  # imported by the forkserver, not by each worker


def test_warm_start_starts_only_the_servers_a_layouts_processes_fork_from(tmp_path):
    """Env workers fork from the env server (gymnasium), policy processes from the torch one:
    warming for a layout of env workers starts the first only (the online tuner's first trial
    waited 1.6 s for torch it never used), and the executor says which layouts still wait."""
    main, _ = run_probe_script(tmp_path, """
        import functools, os, sys
        import torch
        from auturi import Config, make_executor
        from auturi.envs import CountingEnv
        from auturi.nets import MLPActorCritic
        from auturi.policy import TorchPolicy

        if __name__ == "__main__":
            env_fn = functools.partial(CountingEnv)
            env = env_fn()
            net = functools.partial(MLPActorCritic, env.observation_space.shape[0], env.action_space.n)
            ex = make_executor(env_fn, TorchPolicy(net, env.action_space), num_envs=4,
                               config=Config.serial(4), backend="shm")
            degree = Config(envs_per_actor=4, env_parallel_degree=4)
            actors = Config(num_actors=2, envs_per_actor=2)
            before = (ex.needs_warm_start(degree), ex.needs_warm_start(actors), ex.warming)
            ex.warm_start(degree)
            started = sorted(ex._warm)
            assert ex.wait_warm(timeout=60) and not ex.warming
            after = (ex.needs_warm_start(degree), ex.needs_warm_start(actors))
            ex.warm_start(actors)
            assert ex.wait_warm(timeout=120)
            last = (ex.needs_warm_start(actors), sorted(ex._warm))
            ex.reconfigure(actors)
            ex.collect(2)
            ex.close()
            # A server a started process forked from serves: no trial waits for it again.
            ex2 = make_executor(env_fn, TorchPolicy(net, env.action_space), num_envs=4, config=degree, backend="shm")
            built = (ex2.needs_warm_start(degree), ex2.needs_warm_start(actors))
            ex2.close()
            with open(os.path.join(sys.argv[1], str(os.getpid())), "w") as f:
                f.write(repr((before, started, after, last, built)))
            print(os.getpid(), flush=True)
    """)
    before, started, after, last, built = eval(main)
    assert before == (True, True, False)
    assert started == ["env"]  # the torch server is not started for env workers
    assert after == (False, True)
    assert last == (False, ["env", "torch"])
    assert built == (False, True)  # its env workers forked from the env server; the torch one is not started


def test_env_workers_fork_from_auturis_server_when_another_library_started_the_standard_one(tmp_path):
    """SB3's SubprocVecEnv (built before ``auturi.wrap``) starts the standard forkserver, whose
    preload is then fixed for the whole process: env workers forked from it imported gymnasium
    and auturi themselves (7 workers took 1.1 s to start instead of 0.1). They fork from
    Auturi's own env server, also where their factories name no module of their own."""
    main, workers = run_probe_script(tmp_path, """
        import functools, multiprocessing, os, sys
        from multiprocessing import forkserver
        from auturi import Config, make_executor
        from auturi.envs import CountingEnv
        from auturi.policy import RandomPolicy

        def noop():
            pass

        if __name__ == "__main__":
            other = multiprocessing.get_context("forkserver").Process(target=noop)  # as SubprocVecEnv's
            other.start()
            other.join()
            standard = forkserver._forkserver._forkserver_pid
            assert "torch" not in sys.modules  # a torch-free policy's actors fork from the env server too
            env_fn = functools.partial(CountingEnv)
            from auturi.executor.shm.forkservers import ENV_PRELOAD, _servers
            # env workers, then actors (they run the policy in process)
            for config in (Config(envs_per_actor=4, env_parallel_degree=4), Config(num_actors=2, envs_per_actor=2)):
                ex = make_executor(env_fn, RandomPolicy(env_fn().action_space), num_envs=4, config=config,
                                   backend="shm")
                ex.collect(2)
                ours = _servers[tuple(ENV_PRELOAD)]._forkserver_pid
                for slot in ex._slots:
                    with open(f"/proc/{slot.proc.pid}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    where = "ours" if ppid == ours else ("standard" if ppid == standard else str(ppid))
                    with open(os.path.join(sys.argv[1], str(slot.proc.pid)), "w") as f:
                        f.write(f"{slot.kind} {where}")
                ex.close()
            with open(os.path.join(sys.argv[1], str(os.getpid())), "w") as f:
                f.write("main")
            print(os.getpid(), flush=True)
    """)
    assert main == "main" and sorted(workers.values()) == ["actor ours"] * 2 + ["env ours"] * 3, workers


def test_the_modules_a_factory_imports_when_called_are_found_too():
    """An id's env class (``gym.make`` imports its ``module:Class`` entry point) and SB3's
    wrappers (the SB3 face's recipe imports them when applied) are named by no pickle; each
    env worker imported them itself, SB3's pulling in torch (an Atari model's 8 env workers:
    9.5 s of a 2-core wrap, 5.1 s with them preloaded)."""
    import gymnasium as gym

    from auturi.adapters.sb3.envs import EnvFactory
    from auturi.envs import resolve_env_fns

    gym.register("auturi-test/PreloadProbeById-v0", entry_point="tests.preload_probe:PreloadProbeEnv",
                 kwargs={"directory": "/tmp"})
    try:
        (by_id,) = resolve_env_fns("auturi-test/PreloadProbeById-v0", 1)
        assert "tests.preload_probe" in modules_to_preload(by_id)
        recipe = EnvFactory(("make", gym.spec("auturi-test/PreloadProbeById-v0")),
                            [("atari", {}), ("sb3_monitor", {})])
        (fn,) = resolve_env_fns([recipe], 1)
        mods = modules_to_preload(fn)
        assert {"tests.preload_probe", "stable_baselines3.common.atari_wrappers",
                "stable_baselines3.common.monitor"} <= set(mods), mods
    finally:
        gym.registry.pop("auturi-test/PreloadProbeById-v0", None)


@pytest.mark.parametrize("module", ["tests.preload_probe", "sibling_probe_env"])
def test_env_workers_fork_with_an_ids_env_module_imported(tmp_path, module):
    """``sibling_probe_env``: a module beside the script, which runs from another directory
    (the suite's), so the module is on the caller's path only. Python 3.11's forkserver takes
    the caller's ``sys.path`` and does not apply it: its preload of the module failed silently
    and each env worker imported the module itself (one importing torch cost seconds a
    worker; 2026-11-27)."""
    import shutil

    shutil.copy(os.path.join(os.path.dirname(__file__), "preload_probe.py"), tmp_path / "sibling_probe_env.py")
    main, workers = run_probe_script(tmp_path, """
        import os, sys
        import gymnasium as gym
        from auturi import Config, make_executor
        from auturi.policy import RandomPolicy

        if __name__ == "__main__":
            gym.register("auturi-test/PreloadProbeById-v0", entry_point="MODULE:PreloadProbeEnv",
                         kwargs={"directory": sys.argv[1]})
            env_id = "auturi-test/PreloadProbeById-v0"
            ex = make_executor(env_id, RandomPolicy(gym.make(env_id).action_space), num_envs=4,
                               config=Config(envs_per_actor=4, env_parallel_degree=4), backend="shm")
            ex.collect(2)
            ex.close()
            print(os.getpid(), flush=True)
    """.replace("MODULE", module))
    assert os.getcwd() != str(tmp_path)  # the script runs from elsewhere
    assert main == "1" and len(workers) == 3
    assert set(workers.values()) == {"0"}, workers  # the id's module came with the forkserver


def test_a_many_core_tuned_start_has_the_env_server_importing_before_its_envs_are_made():
    """On 12 cores or more the online tuner starts the env workers' server at its wrap-time
    look; the face starts it before the executor makes the start's envs in the caller (the
    H200 box's DummyVecEnv model made 32 Pong envs and profiled before the server's imports began)."""
    from auturi import RandomPolicy
    from auturi.adapters.common import build_collector
    from auturi.envs import CountingEnv
    from tests import preload_probe

    preload_probe.SEEN.clear()
    col = build_collector([preload_probe.ServerWatch()] * 4, RandomPolicy(CountingEnv().action_space), 4,
                          config=None, tune=True, strategy="model", budget={"cores": 16}, backend="shm", seed=0,
                          worker_timeout=None, workload={})
    try:
        assert col.tuner is not None and preload_probe.SEEN and preload_probe.SEEN[0], preload_probe.SEEN
        assert "tests.preload_probe" in col.executor._env_modules  # the executor's own server: the same one
    finally:
        col.executor.close()


def test_the_env_server_starts_early_only_where_the_tuner_would_start_it_at_wrap_time():
    from auturi import Config
    from auturi.adapters.common import _env_workers_soon

    serial = Config.serial(8)
    assert _env_workers_soon(serial, 8, {"cores": 16})
    assert not _env_workers_soon(serial, 8, {"cores": 4})  # few cores: the first collect decides
    assert not _env_workers_soon(serial, 8, {"cores": 16, "early_env_share": None})  # the look is off
    assert not _env_workers_soon(Config(1, 8, 8), 8, {"cores": 16})  # the start has env workers already
    assert not _env_workers_soon(Config.serial(1), 1, {"cores": 16})  # one env: no env workers



def test_a_ctrl_c_while_a_server_imports_its_preloads_is_not_its_to_handle(tmp_path, monkeypatch, capfd):
    """A terminal's Ctrl-C reaches the whole process group, the servers too; one landing while
    a server imported its preloads (the auturi package first: before its preload module could
    ignore SIGINT) printed a KeyboardInterrupt traceback beside the caller's clean
    "interrupted", and the server died. The servers start with SIGINT blocked."""
    import multiprocessing as mp
    import signal

    from auturi.executor.shm import forkservers
    from auturi.executor.shm.processes import start_without_main

    mark = tmp_path / "importing"
    monkeypatch.setenv("AUTURI_TEST_IMPORT_MARK", str(mark))
    unique = (f"tests.no_such_module_{os.getpid()}",)  # a server of this test's own
    server = forkservers._server(("tests.slow_import_probe",) + unique)
    server.ensure_running()
    deadline = time.monotonic() + 60
    while not mark.exists():  # the server is inside the probe's import now
        assert time.monotonic() < deadline, "the server never imported the probe"
        time.sleep(0.01)
    pid = int(mark.read_text())
    os.kill(pid, signal.SIGINT)
    (tmp_path / "importing.go").touch()
    from tests.slow_import_probe import ProbeFirstProcess, say

    mine, theirs = mp.get_context("forkserver").Pipe(duplex=False)
    proc = ProbeFirstProcess(target=say, args=(theirs,))
    proc.preload = unique
    start_without_main(proc)
    theirs.close()
    assert mine.poll(60) and mine.recv() == "forked"
    proc.join(10)
    assert server._forkserver_pid == pid  # the same server: it was not killed and started again
    assert "KeyboardInterrupt" not in capfd.readouterr().err
