import pytest

from auturi import Config, ConfigError


def test_defaults_are_serial():
    c = Config.serial(8)
    assert c.is_serial and c.num_envs == 8 and c.policy_batch_size == 8
    assert c.num_processes == 0


@pytest.mark.parametrize("kwargs, knob", [
    ({"num_actors": 0}, "num_actors"),
    ({"envs_per_actor": 4, "env_parallel_degree": 3}, "env_parallel_degree"),
    ({"envs_per_actor": 2, "policies_per_actor": 3}, "policies_per_actor"),
    ({"envs_per_actor": 2, "policy_batch_size": 3}, "policy_batch_size"),
    ({"policy_device": "gpu"}, "policy_device"),
    ({"envs_per_actor": 2.0}, "envs_per_actor"),
])
def test_invalid_configs_name_the_knob(kwargs, knob):
    with pytest.raises(ConfigError) as e:
        Config(**kwargs)
    assert e.value.knob == knob
    assert knob in str(e.value)


def test_json_round_trip_and_str():
    c = Config(num_actors=2, envs_per_actor=8, env_parallel_degree=4, policies_per_actor=2,
               policy_device="cuda:1", policy_batch_size=4)
    assert Config.from_json(c.to_json()) == c
    assert str(c) == "actors=2 x envs=8 | env_degree=4 | policies=2@cuda:1 batch=4"
    assert c.num_processes == 2 + 2 * (3 + 2)


def test_unknown_key_in_json_is_named():
    with pytest.raises(ConfigError, match="num_gpus"):
        Config.from_dict({"num_actors": 1, "num_gpus": 1})


def test_cuda_config_rejected_without_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the rejection only happens without one")
    import gymnasium as gym

    from auturi import RandomPolicy, make_executor
    from auturi.envs import CountingEnv

    with make_executor(CountingEnv, RandomPolicy(gym.spaces.Discrete(3)), num_envs=2, backend="serial") as ex:
        with pytest.raises(ConfigError, match="policy_device.*cpu"):
            ex.reconfigure(Config(envs_per_actor=2, policy_device="cuda"))
