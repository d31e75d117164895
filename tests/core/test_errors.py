"""One error hierarchy: everything ratewarden raises on purpose is a RatewardenError."""

from __future__ import annotations

import pytest

import ratewarden
from ratewarden import ConfigurationError, LimitUnavailable, RatewardenError, StoreError, parse_rate
from ratewarden.errors import ConfigurationError as FromErrors
from ratewarden.fastapi import RateLimitExceeded
from ratewarden.limits import Limit
from ratewarden.stores.base import StoreError as FromStores


def test_every_error_has_the_common_base() -> None:
    for cls in (ConfigurationError, StoreError, LimitUnavailable, RateLimitExceeded):
        assert issubclass(cls, RatewardenError), cls
    from ratewarden.policy import PolicyError

    assert issubclass(PolicyError, ConfigurationError)
    assert issubclass(ConfigurationError, ValueError)  # code catching ValueError keeps working
    assert FromErrors is ConfigurationError and FromStores is StoreError
    assert {"RatewardenError", "ConfigurationError", "StoreError", "LimitUnavailable"} <= set(ratewarden.__all__)


@pytest.mark.parametrize("make", [lambda: parse_rate("10 per fortnight"), lambda: Limit(parse_rate("1/s"), "nope")])
def test_bad_configuration_is_a_configuration_error(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as info:
        make()
    assert "fortnight" in str(info.value) or "unknown algorithm 'nope'" in str(info.value)


async def test_an_unreachable_store_is_a_store_error_that_keeps_its_cause() -> None:
    from redis.exceptions import RedisError

    from ratewarden.stores.redis import RedisStore

    store = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)  # nothing listens on port 1
    try:
        with pytest.raises(StoreError) as info:
            await store.hit(["rw:errors:k"], [Limit(parse_rate("1/s"))], [1.0])
        assert isinstance(info.value, RatewardenError)
        assert isinstance(info.value.__cause__, RedisError | OSError), repr(info.value.__cause__)
    finally:
        await store.close()
