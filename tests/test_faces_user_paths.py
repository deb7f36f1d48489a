"""User paths through the faces that the other tests do not take (found by driving the CLI,
the status page and the RLlib face as a user would, 2026-11-26; /work/notes/faces-findings.md):
``--out`` and ``auturi show`` given a directory or a file system that refuses files, a status
port in use, Ctrl-C while the command line loads, and on RLlib: a second ``auturi.wrap`` of
one config, options refused at wrap time instead of inside ``build_algo()``, the reason a
runner has no RLModule, ``env_config`` in the results cache's key, and what results report
after ``auturi.unwrap(algo)``.

The CLI cases run in this process (``auturi.cli.app.main``): input errors exit before any
worker or heavy import, so a subprocess per case would only add start-up time."""
from __future__ import annotations

import socket
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import auturi
from auturi import Config

pytest.importorskip("typer")


def run_cli(args: list[str], capsys, monkeypatch, tmp_path: Path) -> tuple[int, str, str]:
    """``auturi ARGS`` in this process: its exit code, stdout and stderr."""
    from auturi.cli.app import main

    monkeypatch.setenv("AUTURI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("AUTURI_STATUS_TOKEN", raising=False)
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("auturi: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------- the CLI
def test_out_that_cannot_be_written_fails_before_tuning(tmp_path, capsys, monkeypatch):
    """A directory given as the file, a parent that is a file, and (Linux) a directory that
    takes no new file even for root: exit 2 at once, naming the fix. Before, the first and
    last were found only after the whole tuning (root passes ``os.access``)."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    cases = [([str(tmp_path)], f"--out {tmp_path} is a directory; pass a file path, e.g. --out "
                               f"{tmp_path / 'result.json'}"),
             ([str(a_file / "r.json")], f"{a_file} is not a directory")]
    if Path("/proc/self").is_dir():  # procfs refuses new files whoever asks
        cases.append((["/proc/r.json"], "directory /proc cannot take a new file"))
    for out, want in cases:
        code, stdout, err = run_cli(["tune", "CartPole-v1", "--out", *out], capsys, monkeypatch, tmp_path)
        assert code == 2 and stdout == ""
        assert want in one_error_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # the write probe left nothing


def test_show_names_a_directory_and_a_device(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["show", str(tmp_path)], capsys, monkeypatch, tmp_path)
    assert code == 2 and f"{tmp_path} is a directory; pass a results file" in one_error_line(err)
    if Path("/dev/null").exists():
        code, _, err = run_cli(["show", "/dev/null"], capsys, monkeypatch, tmp_path)
        assert code == 2 and "/dev/null is not a regular file" in one_error_line(err)


def test_policy_given_a_directory_says_so(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["tune", "CartPole-v1", "--policy", str(tmp_path)], capsys, monkeypatch, tmp_path)
    assert code == 2 and f"--policy {tmp_path} is a directory; pass the .zip file" in one_error_line(err)


def test_infinite_budget_seconds_says_finite(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["tune", "CartPole-v1", "--budget-seconds", "inf"], capsys, monkeypatch, tmp_path)
    line = one_error_line(err)
    assert code == 2 and "--budget-seconds must be > 0 and finite, got inf" in line and "--budget-trials" in line


def test_status_port_in_use_fails_before_any_worker_starts(tmp_path, capsys, monkeypatch):
    """The status server binds before tuning starts: a port in use is exit 2 without starting
    the executor (tune_api is never called). Before, it was found once the workers were up."""
    pytest.importorskip("fastapi")
    import auturi.tuner.api

    def no_tuning(*args, **kwargs):
        raise AssertionError("tuning started before the status port was bound")

    monkeypatch.setattr(auturi.tuner.api, "tune", no_tuning)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli(["tune", "CartPole-v1", "--status-port", str(port), "--policy", "mlp", "--num-envs",
                                "2"], capsys, monkeypatch, tmp_path)
    assert code == 2
    assert f"auturi: error: port {port} on 127.0.0.1 is in use: pick another" in err
    assert "Traceback" not in err


def test_ctrl_c_while_parsing_is_one_line_and_exit_130(capsys, monkeypatch):
    """Ctrl-C before a command runs (click turns it into Abort): one line, exit 130, no
    traceback."""
    import click
    import typer

    from auturi.cli import app as app_module

    class Interrupted:
        def main(self, **kwargs):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as e:
                raise click.exceptions.Abort() from e  # what click's main does with standalone_mode=False

    monkeypatch.setattr(typer.main, "get_command", lambda app: Interrupted())
    with pytest.raises(SystemExit) as e:
        app_module.main(["tune", "CartPole-v1"])
    _, err = capsys.readouterr()
    assert e.value.code == 130
    assert "interrupted (Ctrl-C) while starting" in one_error_line(err)


# ---------------------------------------------------------------------------- RLlib
def ppo(num_env_runners: int = 2, per: int = 3, env: object = "CartPole-v1", **env_config):
    pytest.importorskip("ray.rllib")
    pytest.importorskip("torch")
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment(env, env_config=env_config)
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=per, rollout_fragment_length=4)
            .training(train_batch_size_per_learner=4 * num_env_runners * per, minibatch_size=4, num_epochs=1))


def test_a_second_wrap_replaces_the_first_and_a_failed_one_keeps_it():
    """Wrapping one config twice (a notebook cell run again) used to fail with "the config
    already sets env_runner_cls=AuturiEnvRunner ... cannot combine with a custom one"."""
    from auturi.adapters.rllib.base import OPTIONS_ATTR

    cfg = ppo()
    auturi.wrap(cfg, strategy="grid")
    fixed = Config(num_actors=2, envs_per_actor=3)
    assert auturi.wrap(cfg, config=fixed) is cfg
    opts = vars(cfg)[OPTIONS_ATTR]
    assert opts["config"] == fixed and opts["strategy"] == "model"  # the second call's options, whole
    assert opts["start"] == Config(num_actors=2, envs_per_actor=3, policy_batch_size=3)  # RLlib's 2 runners
    assert (cfg.num_env_runners, cfg.num_envs_per_env_runner) == (0, 6)  # 6 envs, not 0 runners x 6 again
    with pytest.raises(auturi.ConfigError, match="must equal the config's total envs"):
        auturi.wrap(cfg, config=Config(num_actors=4, envs_per_actor=1))
    assert vars(cfg)[OPTIONS_ATTR] is opts  # the failed wrap left the earlier one in place
    assert (cfg.num_env_runners, cfg.num_envs_per_env_runner, cfg.env_runner_cls.__name__) == (0, 6, "AuturiEnvRunner")
    auturi.unwrap(cfg)
    assert (cfg.num_env_runners, cfg.num_envs_per_env_runner, cfg.env_runner_cls) == (2, 3, None)


@pytest.mark.parametrize("kwargs, words", [
    ({"strategy": "fast"}, "strategy must be one of ['grid', 'model', 'optuna']"),
    ({"status_port": 70000}, "status_port must be a port number in 0..65535"),
    ({"status_port": "8000"}, "status_port must be a port number"),
    ({"seed": 1.5}, "seed must be a whole number >= 0"),
    ({"seed": "a"}, "seed must be a whole number >= 0"),
    ({"total_timesteps": "1e6"}, "total_timesteps must be a positive whole number of env steps"),
    ({"total_timesteps": 2.5}, "total_timesteps must be a positive whole number of env steps"),
])
def test_wrap_refuses_options_that_would_fail_inside_build_algo(kwargs, words):
    """Before, these passed ``auturi.wrap`` and failed inside ``build_algo()`` (after Ray and the
    EnvRunner started), were truncated (``seed=1.5``), or raised int()'s bare ValueError."""
    cfg = ppo()
    with pytest.raises(ValueError) as e:
        auturi.wrap(cfg, **kwargs)
    assert words in str(e.value)
    assert cfg.env_runner_cls is None and cfg.num_env_runners == 2  # nothing changed


def test_wrap_takes_numpy_seeds_and_float_step_counts():
    from auturi.adapters.rllib.base import OPTIONS_ATTR

    cfg = auturi.wrap(ppo(), seed=np.int64(3), total_timesteps=1e6)
    assert vars(cfg)[OPTIONS_ATTR]["seed"] == 3 and vars(cfg)[OPTIONS_ATTR]["total_timesteps"] == 1_000_000


class MultiBinaryEnv(gym.Env):
    """Box observations, MultiBinary actions: RLlib's catalog has no distribution for them."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def __init__(self, config=None):
        pass

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_an_action_space_rllib_cannot_serve_is_named():
    """RLlib's runner swallows its module's build error; the wrapped runner used to say only
    "the algorithm defines no RLModule for its EnvRunner"."""
    from auturi.adapters.rllib import AuturiEnvRunner, UnsupportedConfigError

    cfg = auturi.wrap(ppo(0, 2, MultiBinaryEnv), config=Config.serial(2), backend="serial")
    with pytest.raises(UnsupportedConfigError, match=r"supports Discrete and Box action spaces, not MultiBinary\(3\)"):
        AuturiEnvRunner(config=cfg)


def test_a_runner_without_a_module_says_why():
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.ppo import PPOConfig

    from auturi.adapters.rllib import AuturiEnvRunner, UnsupportedConfigError

    class NoModuleConfig(PPOConfig):
        def get_rl_module_spec(self, *args, **kwargs):
            raise NotImplementedError("no module for this probe")

    cfg = (NoModuleConfig().environment("CartPole-v1").env_runners(num_env_runners=0, num_envs_per_env_runner=2))
    auturi.wrap(cfg, config=Config.serial(2), backend="serial")
    with pytest.raises(UnsupportedConfigError) as e:
        AuturiEnvRunner(config=cfg)
    assert "the EnvRunner has no RLModule (building it raised NotImplementedError: no module for this probe)" \
        in str(e.value)


def test_env_config_is_part_of_the_cache_key():
    """Two runs of one env id under different ``env_config`` used to share a results-cache
    record (the key named the id only): the second started from the first one's choice."""
    from auturi.adapters.rllib.envs import RLlibEnvFactory
    from auturi.adapters.rllib.runner import cache_workload

    cfg = ppo()
    short, long = (RLlibEnvFactory("make", "CartPole-v1", {"max_episode_steps": n}, "CartPole-v1") for n in (5, 500))
    plain = RLlibEnvFactory("make", "CartPole-v1", {}, "CartPole-v1")
    keys = [cache_workload(cfg, f) for f in (short, long, plain)]
    assert keys[2] == {"rllib": "PPO", "env": "CartPole-v1"}  # unchanged where there is no env_config
    assert keys[0]["env"] == 'CartPole-v1 {"max_episode_steps": 5}'
    assert len({k["env"] for k in keys}) == 3


def test_results_stop_reporting_auturi_after_unwrap():
    """After ``auturi.unwrap(algo)`` RLlib's own loop samples; the runner's metrics used to keep
    reporting the closed executor's layout (``phase: fixed``) as if it still sampled."""
    from auturi.adapters.rllib import AuturiEnvRunner

    runner = AuturiEnvRunner(config=auturi.wrap(ppo(0, 2), config=Config.serial(2), backend="serial"))
    try:
        runner.sample()
        config = runner.get_metrics()["auturi"]["config"]
        assert getattr(config, "peek", lambda: config)() == str(Config.serial(2))  # a Stats object on ray 2.60
        runner.auturi.close()  # what auturi.unwrap(algo) does to algo.env_runner
        runner.sample()  # RLlib's own loop now
        assert "auturi" not in runner.get_metrics()
    finally:
        runner.stop()



def test_the_report_says_where_the_actors_ran(tmp_path):
    """``auturi tune --backend ray`` printed its table, then failed with ModuleNotFoundError
    (auturi.executor.ray_cluster, moved to auturi.executor.ray.cluster) on the lines that say
    where the choice's actors ran, exit 1 after a whole tuning. ``--json`` took another path."""
    import io

    from rich.console import Console

    from auturi.cli.app import _report
    from auturi.envs import CountingEnv

    result = auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=2, num_steps=4,
                         budget_trials=1, backend="serial", cache=False)
    out, err = Console(file=io.StringIO(), width=100), Console(file=io.StringIO(), width=100)
    places = [{"actor": 0, "envs": [0, 1], "node": "ab12cd34ef56aa", "ip": "10.0.0.2", "pid": 41}]
    _report(result, None, False, False, None, err, out, places)
    text = out.file.getvalue()
    assert "Where its actors ran (1 node):" in text and "10.0.0.2" in text and "41" in text, text


def test_an_unreachable_ray_address_is_one_line_before_the_env_is_built(tmp_path, capsys, monkeypatch):
    """An address nobody listens on: one line in the CLI's words (``--address``, not
    ``address=None``; no pointer to --debug), before the env and policy are built (it came after
    them). Exit 1, as tests/test_cli.py pins."""
    pytest.importorskip("ray")
    import auturi.cli.app as app_module

    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(app_module, "resolve_env_spec", lambda *a: pytest.fail("the env was resolved first"))
    code, _, err = run_cli(["tune", "CartPole-v1", "--backend", "ray", "--address", f"127.0.0.1:{port}"], capsys,
                           monkeypatch, tmp_path)
    line = one_error_line(err)
    assert code == 1 and f"127.0.0.1:{port}" in line and "ray start --head" in line and "leave out --address" in line
    assert "--debug" not in line


@pytest.mark.parametrize("args, words", [
    (["--num-envs", "99999999999999999999"], "--num-envs must be <= 2,147,483,647"),
    (["--num-steps", "99999999999999999999"], "--num-steps must be <= 2,147,483,647"),
    (["--seed", "-1"], "--seed must be >= 0"),
])
def test_out_of_range_counts_and_seeds_are_bad_input(args, words, tmp_path, capsys, monkeypatch):
    """These were exit 1 after starting: OverflowError inside a trial, gymnasium's "Error: Seed
    must be greater or equal to zero" with a pointer to --debug."""
    code, _, err = run_cli(["tune", "CartPole-v1", *args], capsys, monkeypatch, tmp_path)
    assert code == 2 and words in one_error_line(err)


def test_dict_observations_name_the_wrapper_that_works(tmp_path, capsys, monkeypatch):
    """ENV with Dict observations: the hint was "pass --policy PATH.zip with a saved SB3 model",
    which does not take Dict observations either."""
    (tmp_path / "dict_envs.py").write_text(
        "import gymnasium as gym\nimport numpy as np\n\n\n"
        "class DictObs(gym.Env):\n"
        "    observation_space = gym.spaces.Dict({'a': gym.spaces.Box(-1, 1, (3,), np.float32)})\n"
        "    action_space = gym.spaces.Discrete(2)\n\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return {'a': np.zeros(3, np.float32)}, {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli(["tune", "dict_envs:DictObs"], capsys, monkeypatch, tmp_path)
    line = one_error_line(err)
    assert code == 2 and "ENV gives Dict observations" in line and "FlattenObservation" in line
    assert "pass --policy PATH.zip" not in line
