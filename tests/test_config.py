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


def test_a_knob_typo_names_the_closest_knob_and_all_of_them():
    with pytest.raises(TypeError, match="no knob 'num_actor': did you mean 'num_actors'") as e:
        Config(num_actor=2)
    assert all(k in str(e.value) for k in Config.knob_names())
    with pytest.raises(TypeError, match="no knob 'gpu'"):
        Config(gpu=True)


def test_a_wrong_total_says_the_default_and_the_configs_that_fit():
    from auturi.config import total_envs_error

    e = total_envs_error(Config(num_actors=3), 8, "the model's n_envs")
    assert e.knob == "num_actors*envs_per_actor" and e.value == 3
    assert "envs_per_actor defaults to 1" in e.rule
    assert "Config(num_actors=2, envs_per_actor=4)" in e.rule and "Config(num_actors=3" not in e.rule
