"""Envs whose ids a module registers when imported work in the caller and in every worker
(issue 18, item 2), and a warning that every worker raises at start shows once (item 5)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import uuid

import gymnasium as gym
import numpy as np
import pytest

import auturi
from auturi.envs import resolve_env_fns

# degree 2: the second half of the envs steps in a worker process, which never imported the
# module that registered the id
WORKERS = auturi.Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2)


def _user_module(tmp_path, monkeypatch) -> tuple[str, str]:
    """A module on sys.path that registers a fresh id when imported; (module, id)."""
    name = f"user_envs_{uuid.uuid4().hex[:8]}"
    env_id = f"UserCounting{uuid.uuid4().hex[:6]}-v0"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import gymnasium as gym
        from auturi.envs import CountingEnv

        class UserEnv(CountingEnv):
            pass

        gym.register({env_id!r}, entry_point={name + ':UserEnv'!r})
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # workers get the caller's sys.path
    return name, env_id


def _collect(env, backend="shm", config=WORKERS, steps=6):
    with auturi.make_executor(env, auturi.RandomPolicy(gym.spaces.Discrete(3)), 2, config, backend=backend) as ex:
        return ex.collect(steps)


def test_module_colon_id_reaches_workers(tmp_path, monkeypatch):
    """gymnasium's ``module:Env-v0``: imported here and in the worker before gym.make; the
    data equal the serial backend's."""
    module, env_id = _user_module(tmp_path, monkeypatch)
    fns = resolve_env_fns(f"{module}:{env_id}", 2)
    assert fns[0].module == module and fns[0].env_id == env_id
    shm = _collect(f"{module}:{env_id}")
    serial = _collect(f"{module}:{env_id}", backend="serial", config=None)
    np.testing.assert_array_equal(shm.observations, serial.observations)
    np.testing.assert_array_equal(shm.actions, serial.actions)


def test_an_id_registered_only_in_the_caller_reaches_workers(tmp_path, monkeypatch):
    """The caller imported the module; the worker has not: it makes the env from the id's
    EnvSpec, which the factory carries."""
    module, env_id = _user_module(tmp_path, monkeypatch)
    __import__(module)
    ro = _collect(env_id)
    assert ro.observations.shape[:2] == (6, 2)


def test_unknown_namespace_provider_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as when ale-py is not installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else
                        importlib.machinery.PathFinder.find_spec(name))
    with pytest.raises(ValueError, match=r"needs ale_py, which is not installed.*auturi\[atari\]"):
        resolve_env_fns("ALE/NoSuchGame-v5", 1)


ale = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py is not installed")


@ale
def test_ale_id_without_importing_ale_py_in_workers():
    """``ALE/Pong-v5`` imports ale_py here (gymnasium 1.x loads no plugins) and in the worker."""
    ro = _collect("ALE/Pong-v5", steps=4)
    assert ro.observations.shape == (4, 2, 210, 160, 3)


# ``auturi tune ALE/Pong-v5`` through the CLI, with env workers: test_cli_atari's
# test_cli_tunes_pong_with_the_cnn_and_the_mlp (run there at once beside the cnn one).


WARNS = textwrap.dedent("""
    import multiprocessing, warnings, gymnasium as gym, auturi
    from auturi.envs import CountingEnv

    class Warns(CountingEnv):
        def __init__(self):
            where = "caller" if multiprocessing.parent_process() is None else "worker"
            warnings.warn(f"this env is deprecated: use v5 ({where})", DeprecationWarning)
            super().__init__()

    if __name__ == "__main__":
        config = auturi.Config(num_actors=1, envs_per_actor=4, env_parallel_degree=4)
        with auturi.make_executor(Warns, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4, config) as ex:
            ex.collect(2)
""")


def test_a_warning_every_worker_raises_shows_once(tmp_path):
    """Three env workers each warn at start (with -W always: every warning is shown); stderr
    shows the workers' warning once. The caller's own are its own business."""
    script = tmp_path / "warns.py"
    script.write_text(WARNS)
    out = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", str(script)], capture_output=True,
                         text=True, timeout=120, check=False,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("DeprecationWarning: this env is deprecated: use v5 (worker)") == 1, out.stderr
    assert "DeprecationWarning: this env is deprecated: use v5 (caller)" in out.stderr
