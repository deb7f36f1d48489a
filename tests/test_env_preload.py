"""Env workers start with the modules their env factories need already imported: the env
forkserver preloads them (a worker that imported SB3's Monitor itself paid 1.4 s per start)."""
import functools
import os
import subprocess
import sys
import textwrap

from auturi.executor.shm.forkservers import modules_to_preload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
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
    """))
    probes = tmp_path / "probes"
    probes.mkdir()
    out = subprocess.run([sys.executable, str(script), str(probes)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    main_pid = out.stdout.split()[-1]
    seen = {p.name: p.read_text() for p in probes.iterdir()}
    workers = {pid: v for pid, v in seen.items() if pid != main_pid}
    assert seen[main_pid] == "1" and len(workers) == 3
    assert set(workers.values()) == {"0"}, workers  # imported by the forkserver, not by each worker
