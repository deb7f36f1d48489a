"""An executor dropped without ``close()`` inside a reference cycle is ended by the garbage
collector: its ``__del__`` must not touch shared memory the collector may have unmapped."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import functools, gc, os
    import gymnasium as gym
    import auturi
    from auturi.nets import MLPActorCritic
    for trial in range(3):
        policy = auturi.TorchPolicy(functools.partial(MLPActorCritic, 4, 2), gym.spaces.Discrete(2))
        ex = auturi.make_executor("CartPole-v1", policy, num_envs=2, config=auturi.Config.serial(2), seed=0)
        ex.collect(8)
        names = [ex._ctrl.name]
        holder = {"ex": ex}
        holder["self"] = holder  # a cycle, as a model's bound method holding its executor makes
        del ex, holder, policy
        gc.collect()
        assert not any(os.path.exists("/dev/shm/" + n) for n in names), names
    print("survived")
""")


def test_an_executor_in_a_reference_cycle_is_collected_without_a_crash_or_a_leftover():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "survived" in out.stdout
