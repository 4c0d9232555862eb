import pytest

from adaserve.cache.policies import POLICIES, IAMPolicy, create_policy
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import ConfigError


def test_every_paper_baseline_is_a_name() -> None:
    online = {"iam", "lru", "lfu", "arc", "srrip", "gdsf", "lru-cover", "lfu-cover", "gdsf-cover"}
    assert set(POLICIES) == online | {"iam-foresight", "iam-known-rate", "oracle"}
    assert {name for name, policy in POLICIES.items() if policy.needs_future} == set(POLICIES) - online
    stats = StatsRegistry()
    policy = create_policy("IAM", stats, 100, refresh_period_s=5.0)
    assert isinstance(policy, IAMPolicy)
    assert (policy.stats, policy.budget_bytes, policy.refresh_period_s) == (stats, 100, 5.0)


def test_unknown_name_or_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown eviction policy 'mru'; expected one of iam, lru"):
        create_policy("mru", StatsRegistry(), 100)
    with pytest.raises(ConfigError, match=r"eviction policy 'lru'.*bits"):
        create_policy("lru", StatsRegistry(), 100, bits=2)
    with pytest.raises(ConfigError, match="b0 must be positive"):
        create_policy("iam", StatsRegistry(), 100, b0=0)
