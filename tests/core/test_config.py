import math

import pytest

from autellix.core import ConfigError, SchedulerConfig


def test_defaults_are_consistent():
    config = SchedulerConfig()
    assert config.num_queues == len(config.boundaries) + 1
    assert config.policy == "atlas" and config.balancer == "autellix"
    assert config.long_prompt_tokens == 2048


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"policy": "sjf"}, "policy"),
        ({"boundaries": (2.0, 1.0), "quanta": (1, 1, 1)}, "strictly increasing"),
        ({"boundaries": (0.0,), "quanta": (1, 1)}, "positive"),
        ({"quanta": (1, 2)}, "expected 36 values"),
        ({"boundaries": (1, 2), "quanta": (1, 2)}, "expected 3 values"),
        ({"boundaries": (1, 2, 3, 4), "quanta": (1, 2, 0, 4, 5)}, "positive"),
        ({"beta": 0}, "beta"),
        ({"balancer": "random"}, "balancer"),
        ({"multi_step": 0}, "multi_step"),
        ({"boundaries": "1,x", "quanta": (1, 1, 1)}, "list of numbers"),
        ({"max_preemptions": -1}, "max_preemptions: expected >= 0"),
    ],
)
def test_rejects_bad_values_with_the_parameter_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        SchedulerConfig(**changes)


def test_mapping_round_trip_keeps_infinity():
    config = SchedulerConfig(beta=math.inf, boundaries=(1, 3), quanta=(2, 4, math.inf))
    data = config.to_mapping()
    assert data["beta"] == "inf" and data["quanta"] == [2.0, 4.0, "inf"]
    assert SchedulerConfig.from_mapping(data) == config


def test_unknown_keys_are_errors():
    with pytest.raises(ConfigError, match="unknown scheduler parameter"):
        SchedulerConfig.from_mapping({"betta": 2})


def test_env_round_trip():
    config = SchedulerConfig(policy="plas", boundaries=(1, 2), quanta=(8, 16, 32), beta=2.5, multi_step=4,
                             max_preemptions=0)
    env = config.to_env()
    assert env["AUTELLIX_QUANTA"] == "8.0,16.0,32.0"
    assert SchedulerConfig.from_env(env) == config
    assert SchedulerConfig.from_env({}) == SchedulerConfig()


def test_overrides_ignore_none():
    config = SchedulerConfig().with_overrides(beta=None, policy="fcfs")
    assert config.policy == "fcfs" and config.beta == SchedulerConfig().beta


def test_unbounded_quanta_fit_any_number_of_queues():
    config = SchedulerConfig(boundaries=(0.1, 0.4, 1.6, 6.4))
    assert config.quanta == (math.inf,) * 5
    assert SchedulerConfig().with_overrides(boundaries="1,2").quanta == (math.inf,) * 3
    assert SchedulerConfig.from_env({"AUTELLIX_BOUNDARIES": "1,2,3"}).num_queues == 4
