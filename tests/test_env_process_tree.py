"""Env factories behave alike in every process of an executor's tree (issue 34, items 2 and
6): a factory that makes an ALE id works in the workers when the caller registered ALE
(ale_py imported), an id only the caller registered names the fix, and a warning raised
while making the env (MuJoCo's C ones included) shows once in the whole tree, not once per
process."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import uuid

import gymnasium as gym
import pytest

import auturi

WORKERS = auturi.Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2)  # env 1 steps in a worker


def _collect(env_fn, steps=3):
    with auturi.make_executor(env_fn, auturi.RandomPolicy(env_fn().action_space), 2, WORKERS) as ex:
        return ex.collect(steps)


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py is not installed")
def test_a_factory_making_an_ale_id_works_in_the_workers():
    """gymnasium 1.x loads no plugins: the worker had never imported ale_py, and
    ``gym.make("ALE/...")`` raised NameNotFound there. The factory now brings the caller's id
    providers along."""
    import ale_py

    gym.register_envs(ale_py)
    ro = _collect(lambda: gym.make("ALE/Pong-v5", frameskip=4))
    assert ro.observations.shape == (3, 2, 210, 160, 3)


def test_an_id_only_the_caller_registered_names_the_fix():
    env_id = f"CallerOnly{uuid.uuid4().hex[:6]}-v0"
    gym.register(env_id, entry_point="auturi.envs.testing:CountingEnv")
    try:
        with pytest.raises(auturi.WorkerError) as info:
            _collect(lambda: gym.make(env_id))
    finally:
        gym.registry.pop(env_id, None)
    text = info.value.traceback or str(info.value)
    assert "NameNotFound" in text and "import the module that registers the id inside the factory" in text


WARNS = textwrap.dedent("""
    import sys, warnings
    import gymnasium as gym
    import auturi
    from auturi.envs import CountingEnv

    XML = ('<mujoco><compiler settotalmass="2"/><worldbody><body><freejoint/><geom size=".1"/></body>'
           '</worldbody></mujoco>')

    class Warns(CountingEnv):
        def __init__(self):
            warnings.warn("this env is deprecated: use v5", UserWarning)
            if "--mujoco" in sys.argv:
                import mujoco  # imported by the first env made, in each process

                mujoco.MjModel.from_xml_string(XML)  # MuJoCo's C library warns: settotalmass is deprecated
            super().__init__()

    if __name__ == "__main__":
        config = auturi.Config(num_actors=1, envs_per_actor=5, env_parallel_degree=5)  # 4 env workers
        with auturi.make_executor(Warns, auturi.RandomPolicy(gym.spaces.Discrete(3)), 5, config) as ex:
            ex.collect(2)
            ex.reconfigure(auturi.Config.serial(5))  # the caller makes the workers' envs again
            ex.collect(2)
""")


def test_a_warning_raised_making_the_env_shows_once_in_the_process_tree(tmp_path):
    """The caller (its probe, its own envs, the envs it makes again after a reconfigure) and
    4 env workers each make the env; each warning shows once in all. MuJoCo's C warnings
    come as ``auturi.envs.MuJoCoWarning`` and leave no MUJOCO_LOG.TXT behind."""
    script = tmp_path / "warns.py"
    script.write_text(WARNS)
    mujoco = importlib.util.find_spec("mujoco") is not None
    out = subprocess.run([sys.executable, str(script), *(["--mujoco"] if mujoco else [])], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert out.returncode == 0, out.stderr
    both = out.stdout + out.stderr
    assert both.count("UserWarning: this env is deprecated: use v5") == 1, both
    if mujoco:
        assert both.count("settotalmass") == 1, both
        assert "MuJoCoWarning: compiler attribute 'settotalmass' is deprecated" in out.stderr
        assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
