"""A bad store URL or store option is a ``ConfigurationError`` (still a ``ValueError``) naming the mistake."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ratewarden import ConfigurationError
from ratewarden.stores.urls import check_store_url, open_store, parse_store_url


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis://h/x", "the database must be a number, got 'x'"),
        ("redis://h/0/extra", "the database must be a number, got '0/extra'"),
        ("redis://h/-1", "the database must be a number, got '-1'"),
        ("redis+sentinel://h:26379/mymaster/db", "the database must be a number, got 'db'"),
        ("redis+sentinel://h:26379", "names no Sentinel service"),
        ("redis+cluster://h:7000/3", "Redis Cluster has only database 0, got '/3'"),
        ("redis://h:port", "bad port 'port'"),
        ("redis://", "names no host"),
        ("redis://h?pool=3", "unknown option 'pool'"),
        ("redis://h?timeout=soon", "option timeout='soon' must be a number"),
        ("redis://h?pool_size=-2", "option pool_size='-2' must not be negative"),
        ("memcached://h?ssl_keyfile=k", "unknown option 'ssl_keyfile'"),
        ("mongodb://h", "unsupported store URL 'mongodb://h': the scheme must be one of"),
        ("shm://", "names no table"),
        ("shm://a%2Fb", "name must be 1-100 letters"),
        ("shm://api?max_keys=lots", "option max_keys='lots' must be a whole number"),
        ("memory://?max_keys=abc", "option max_keys='abc' must be a whole number"),
        ("redis://localhost:99999", "bad port '99999' in 'localhost:99999' (a port is 1 to 65535)"),
        ("redis://localhost:0", "bad port '0'"),
        ("memcached://[::1]:70000", "bad port '70000'"),
        ("memcache://localhost", "did you mean memcached://?"),
        ("redsi://localhost", "did you mean redis://?"),
        ("memroy://", "did you mean memory://?"),
        ("mongodb://h", "memory://, shm://<name>, redis://"),  # every scheme, the local ones too
        ("memory://x", "memory:// takes no name"),
        ("memory://?max_keys=0", "option max_keys='0' must be at least 1"),
    ],
)
def test_a_bad_store_url_is_a_configuration_error_naming_the_bad_part(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)) as info:
        check_store_url(url)
    assert isinstance(info.value, ValueError)  # code that catches ValueError keeps working
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        open_store(url)


def test_a_bad_url_given_to_a_store_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="MemcachedStore takes exactly one host:port, got 2"):
        open_store("memcached://a:1,b:2")
    with pytest.raises(ConfigurationError, match=re.escape("'redis://h/x'")):
        parse_store_url("redis://h/x", ("standalone",))


def _redis(**options: object) -> object:
    from ratewarden.stores.redis import RedisStore

    return RedisStore("redis://127.0.0.1:1/0", **options)  # type: ignore[arg-type]


def _memcached(**options: object) -> object:
    from ratewarden.stores.memcached import MemcachedStore

    return MemcachedStore("memcached://127.0.0.1:1", **options)  # type: ignore[arg-type]


def _shm(**options: object) -> object:
    from ratewarden.stores.shared_memory import SharedMemoryStore

    return SharedMemoryStore("never-created", **options)  # type: ignore[arg-type]


def _breaker(**options: object) -> object:
    from ratewarden.stores.breaker import Breaker
    from ratewarden.stores.memory import MemoryStore

    return Breaker(MemoryStore(), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "options", "named"),
    [
        (_redis, {"timeout": 0}, "timeout must be positive, got 0.0"),
        (_redis, {"pool_size": 0}, "pool_size must be at least 1, got 0"),
        (_memcached, {"timeout": -1}, "timeout must be positive, got -1.0"),
        (_memcached, {"pool_size": 0}, "pool_size must be at least 1, got 0"),
        (_memcached, {"retries": 0}, "retries must be at least 1, got 0"),
        (_shm, {"max_keys": 0}, "max_keys must be a positive integer, got 0"),
        (_shm, {"log_size": -1}, "log_size must be an integer from 0 to 65536, got -1"),
        (_shm, {"lock": "spin"}, "lock must be 'auto', 'mutex' or 'lockf', got 'spin'"),
        (_breaker, {"failures": 0}, "failures must be at least 1, got 0"),
        (_breaker, {"cooldown": 0}, "cooldown must be positive, got 0"),
    ],
)
def test_a_bad_store_option_is_a_configuration_error_naming_it(
    make: Callable[..., object], options: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        make(**options)


def test_a_missing_tls_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(ConfigurationError, match=re.escape(f"ssl_ca_certs file {str(missing)!r} does not exist")):
        open_store(f"rediss://h?ssl_ca_certs={missing}")
