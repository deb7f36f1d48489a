"""What several test modules share (importable by worker processes): the contract suite's
configs and run/compare helpers, policies and envs for the executor tests, and
:class:`FakeExecutor` for the tuner tests."""
from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from auturi import Config, ConfigError, make_executor
from auturi.envs import CountingEnv, FaultyEnv
from auturi.rollout import CollectStats

# ---------------------------------------------------------------------------- the contract's runs
N = 4
CONFIGS = [
    Config.serial(N),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=4),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=1, policies_per_actor=2, policy_batch_size=2),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policy_batch_size=3),
    Config(num_actors=2, envs_per_actor=2),
    Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1),
    Config(num_actors=2, envs_per_actor=2, env_parallel_degree=1, policies_per_actor=2, policy_batch_size=1),
    Config(num_actors=4, envs_per_actor=1),
]


def ids(c: Config) -> str:
    return f"A{c.num_actors}E{c.envs_per_actor}D{c.env_parallel_degree}P{c.policies_per_actor}B{c.policy_batch_size}"


def counting(action="discrete", **kw):
    return functools.partial(CountingEnv, action=action, **kw)


def run(backend, config, env_fn=None, steps=(7, 7, 5), seed=3, policy=None):
    """The rollouts of consecutive collects of ``steps`` steps on ``N`` envs."""
    env_fn = env_fn or counting()
    space = env_fn().action_space
    policy = policy or ObsHashPolicy(space)
    with make_executor(env_fn, policy, num_envs=N, config=config, backend=backend, seed=seed) as ex:
        return [ex.collect(s) for s in steps]


def assert_same(rollouts_a, rollouts_b):
    """Bit for bit: every array, every final observation and info."""
    for ra, rb in zip(rollouts_a, rollouts_b):
        a, b = ra.arrays(), rb.arrays()
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert ra.final_observations.keys() == rb.final_observations.keys()
        for k in ra.final_observations:
            np.testing.assert_array_equal(ra.final_observations[k], rb.final_observations[k])
        assert ra.final_infos == rb.final_infos


# ---------------------------------------------------------------------------- policies


class ObsHashPolicy:
    """Deterministic and batch-independent: the action depends on the observation and the
    noise of its own row only. Its weight ``w`` is added to a reported extra."""

    def __init__(self, action_space: gym.Space):
        self.space = action_space
        self.noise_dim = 1
        self.w = np.zeros((), np.float64)

    def act(self, obs, noise):
        flat = obs.reshape(len(obs), -1).astype(np.float64)
        h = flat.sum(axis=1) * 0.37 + noise[:, 0]
        extras = {"values": (h * 0.5 + self.w).astype(np.float32), "log_probs": -h.astype(np.float32)}
        if isinstance(self.space, gym.spaces.Discrete):
            return (np.floor(np.abs(h) * 7) % self.space.n).astype(np.int64), extras
        if isinstance(self.space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            n = self.space.nvec if isinstance(self.space, gym.spaces.MultiDiscrete) else 2
            k = np.floor(np.abs(h)[:, None] * (7 + np.arange(np.prod(self.space.shape))))
            return (k % n).astype(self.space.dtype), extras  # int64, int8: each env gets this dtype
        a = np.sin(h)[:, None] * np.ones((1, *self.space.shape))
        return a.astype(np.float32), extras

    def get_state(self):
        return {"w": self.w.copy()}

    def load_state(self, state):
        self.w = np.asarray(state["w"], np.float64).copy()

    def to(self, device):
        pass


class RaisingPolicy(ObsHashPolicy):
    """Raises once ``w`` is set to 1 (so the probe call at construction succeeds)."""

    def act(self, obs, noise):
        if self.w == 1:
            raise ValueError("RaisingPolicy fails on purpose")
        return super().act(obs, noise)


class SuicideEnv(CountingEnv):
    """SIGKILLs its own process at step ``kill_step`` (only outside the caller's process)."""

    def __init__(self, kill_step: int, main_pid: int):
        super().__init__()
        self.kill_step, self.main_pid, self._n = kill_step, main_pid, 0

    def step(self, action):
        self._n += 1
        if self._n >= self.kill_step and os.getpid() != self.main_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class WorkerOnlyFaultyEnv(FaultyEnv):
    """A FaultyEnv whose faults fire only outside the caller's process."""

    def __init__(self, main_pid: int, **kw):
        super().__init__(**kw)
        if os.getpid() == main_pid:
            self.fail_step = self.fail_reset = None


class TorchProbeEnv(CountingEnv):
    """Reports in its info whether torch is loaded in the process stepping it."""

    def step(self, action):
        import sys

        obs, r, te, tr, info = super().step(action)
        info["torch_loaded"] = "torch" in sys.modules
        info["pid"] = os.getpid()
        return obs, r, te, tr, info


class ModuleProbeEnv(CountingEnv):
    """At each step writes ``<directory>/<pid>``: ``1`` if ``module`` is loaded in the process
    stepping it, else ``0``."""

    def __init__(self, module: str, directory: str):
        super().__init__()
        self.module, self.directory = module, directory

    def step(self, action):
        import sys

        with open(os.path.join(self.directory, str(os.getpid())), "w") as f:
            f.write("1" if self.module in sys.modules else "0")
        return super().step(action)


class BlockingEnv(CountingEnv):
    """At step ``block_step``, outside the caller's process, writes ``<directory>/<pid>`` and
    then blocks reading the FIFO ``<directory>/fifo`` (made by the test): a step that never
    ends, until its process is killed."""

    def __init__(self, directory: str, block_step: int, main_pid: int):
        super().__init__()
        self.directory, self.block_step, self.main_pid, self._n = directory, block_step, main_pid, 0

    def step(self, action):
        self._n += 1
        if self._n == self.block_step and os.getpid() != self.main_pid:
            with open(os.path.join(self.directory, str(os.getpid())), "w"):
                pass
            with open(os.path.join(self.directory, "fifo")) as f:  # blocks: nobody writes
                f.read()
        return super().step(action)


class MisbehavingEnv(CountingEnv):
    """Breaks gymnasium's API or its observation space in one way, ``fault``, from its step
    ``from_step`` on (counting from 1; resets misbehave from the first):
    ``old_step`` (gym<0.26 4-tuple step), ``old_reset`` (obs-only reset), ``short_obs``
    (shape (1,) from step: numpy broadcasts it into (4,) silently), ``long_reset_obs``
    (shape (5,) from reset), ``huge`` (float64 1e300 in a float32 Box at every step),
    ``array_reward``, ``no_info`` (None for the info dict), ``none_obs``, ``str_reward``
    (``"1.5"``), ``none_reward``, ``nan_obs`` (NaN in slot 2), ``nan_reward`` or ``none_flag``
    (``terminated`` None)."""

    def __init__(self, fault: str, from_step: int = 1):
        super().__init__()
        self.fault, self.from_step, self._n = fault, from_step, 0

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self.fault == "old_reset":
            return obs
        if self.fault == "long_reset_obs":
            return np.zeros(5, np.float32), info
        return obs, info

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        self._n += 1
        if self._n < self.from_step:
            return obs, r, te, tr, info
        if self.fault == "old_step":
            return obs, r, te or tr, info
        if self.fault == "short_obs":
            obs = obs[:1]
        elif self.fault == "huge":
            obs = obs.astype(np.float64)
            obs[1] = 1e300
        elif self.fault == "array_reward":
            r = np.array([r, r])
        elif self.fault == "no_info":
            info = None
        elif self.fault == "none_obs":
            obs = None
        elif self.fault == "str_reward":
            r = "1.5"
        elif self.fault == "none_reward":
            r = None
        elif self.fault == "nan_obs":
            obs[2] = np.nan
        elif self.fault == "nan_reward":
            r = float("nan")
        elif self.fault == "none_flag":
            te = None
        return obs, r, te, tr, info


class LooseTypesEnv(CountingEnv):
    """Returns what gymnasium's API allows beyond the exact common types, all stored as the
    values they are: float64 observations for its float32 Box, an ``np.float32``, 0-d array,
    bool or int reward and ``np.bool_`` or 0/1 integer flags, in turn by step."""

    def __init__(self):
        super().__init__()
        self._n = 0

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        self._n += 1
        k = self._n % 4
        reward = (np.float32(r), np.array(r), bool(r > 1.0), int(r))[k]
        te, tr = ((np.bool_(te), np.bool_(tr)), (int(te), int(tr)), (te, tr), (np.bool_(te), int(tr)))[k]
        return obs.astype(np.float64), reward, te, tr, info


class StuckEnv(CountingEnv):
    """At step ``stuck_step`` (counting from 1) stops making progress for up to ``seconds``:
    ``how`` is ``"python"`` (a loop of Python bytecode) or ``"fifo"`` (blocked opening
    ``path``, a FIFO the test made, which nobody opens for writing: a system call that never
    returns until interrupted). Bounded so that a watchdog that fails fails the test, not the
    suite; the FIFO's bound is the test's to set (it opens the FIFO to release the reader)."""

    def __init__(self, how: str, stuck_step: int = 3, seconds: float = 30.0, path: str = ""):
        super().__init__()
        self.how, self.stuck_step, self.seconds, self.path, self._n = how, stuck_step, seconds, path, 0

    def step(self, action):
        self._n += 1
        if self._n == self.stuck_step:
            if self.how == "python":
                end = time.monotonic() + self.seconds
                while time.monotonic() < end:
                    pass
            else:
                with open(self.path) as f:
                    f.read()
        return super().step(action)


# ---------------------------------------------------------------------------- the tuner's fake executor
@dataclass
class FakeRollout:
    """What a collect returns: stats like a real Rollout, plus which collect it was."""

    stats: CollectStats
    index: int
    config: Config
    num_steps: int


class FakeExecutor:
    """An executor for the tuner tests: no process is started and nothing depends on real time.

    Throughput ``truth(config) * (1 + noise * N(0, 1))``; the first collect after a
    reconfigure runs at ``warmup_factor`` of that. Time is a fake clock (``clock()``) that
    collects and reconfigures advance. ``slowdown[config]`` multiplies a config's throughput
    (to simulate a drift); ``fail_on`` configs raise in collect."""

    backend = "fake"

    def __init__(self, num_envs: int, truth: Callable[[Config], float], noise: float = 0.0, seed: int = 0,
                 config: Config | None = None, warmup_factor: float = 0.5, reconfigure_seconds: float = 0.5):
        self.num_envs = num_envs
        self.truth, self.noise = truth, noise
        self.rng = np.random.default_rng(seed)
        self._config = config or Config.serial(num_envs)
        self.warmup_factor, self.reconf_s = warmup_factor, reconfigure_seconds
        self.now = 0.0
        self.collects = 0
        self.reconfigures = 0
        self.log: list[tuple[str, Config]] = []
        self.slowdown: dict[Config, float] = {}
        self.fail_on: set[Config] = set()
        self.closed = False
        self._fresh = True

    def clock(self) -> float:
        return self.now

    @property
    def config(self) -> Config:
        return self._config

    def reconfigure(self, config: Config) -> float:
        if self.closed:
            raise RuntimeError("closed")
        if config.num_envs != self.num_envs:
            raise ConfigError("num_actors*envs_per_actor", config.num_envs, f"must equal num_envs={self.num_envs}")
        if config == self._config:
            return 0.0
        self._config = config
        self._fresh = True
        self.reconfigures += 1
        self.log.append(("reconfigure", config))
        self.now += self.reconf_s
        return self.reconf_s

    def true_sps(self, config: Config) -> float:
        return self.truth(config) * self.slowdown.get(config, 1.0)

    def collect(self, num_steps: int) -> FakeRollout:
        if self._config in self.fail_on:
            self.closed = True
            raise RuntimeError(f"worker failed under {self._config}")
        sps = self.true_sps(self._config) * max(0.05, 1.0 + self.noise * self.rng.standard_normal())
        if self._fresh:
            sps *= self.warmup_factor
            self._fresh = False
        steps = num_steps * self.num_envs
        self.now += steps / sps
        self.collects += 1
        self.log.append(("collect", self._config))
        return FakeRollout(CollectStats(steps, steps / sps), self.collects, self._config, num_steps)

    def close(self) -> None:
        self.closed = True


def const(v: float) -> Callable[[Config], float]:
    return lambda c: v


def run_probe_script(tmp_path, source: str) -> tuple[str, dict[str, str]]:
    """Run ``source`` (a training script; ``sys.argv[1]`` is a directory where its envs write
    ``<pid>`` probe files, and it prints its own pid last) in a fresh interpreter with the repo
    on the path; return the caller's probe value and the workers' (pid -> value)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(source))
    probes = tmp_path / "probes"
    probes.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, str(script), str(probes)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr
    main_pid = out.stdout.split()[-1]
    seen = {p.name: p.read_text() for p in probes.iterdir()}
    return seen[main_pid], {pid: v for pid, v in seen.items() if pid != main_pid}
