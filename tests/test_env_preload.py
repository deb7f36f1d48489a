"""Env workers start with the modules their env factories need already imported: the env
forkserver preloads them (a worker that imported SB3's Monitor itself paid 1.4 s per start)."""
import functools

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
