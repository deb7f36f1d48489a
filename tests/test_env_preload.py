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
