"""The RATEWARDEN setting: every option read, a bad value named, nothing read at import time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from ratewarden.django import RateLimitMiddleware, SettingsError, current_config, load_config
from ratewarden.errors import ConfigurationError
from ratewarden.stores.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[2]


def test_importing_configures_nothing() -> None:
    code = (
        "import ratewarden.django, django.conf, sys; "
        "assert not django.conf.settings.configured; "
        "assert 'django.conf' in sys.modules and sys.modules['django'].__file__.find('site-packages') > 0"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_defaults() -> None:
    config = load_config(None)
    assert isinstance(config.limiter.store, MemoryStore)
    assert config.rules is None and config.headers == "always" and config.header_style == "both"
    assert config.limiter.on_error == "open" and config.limiter.prefix == "rw"


@pytest.mark.parametrize(("value", "named"), [
    ({"STORE": "nosuch://x"}, "STORE"),
    ({"STORE": 3}, "STORE"),
    ({"ON_ERROR": "maybe"}, "ON_ERROR"),
    ({"HEADERS": "sometimes"}, "HEADERS"),
    ({"HEADER_STYLE": "x"}, "HEADER_STYLE"),
    ({"TRUSTED_PROXIES": "10.0.0.0/8"}, "TRUSTED_PROXIES"),
    ({"TRUSTED_PROXIES": ["not a network"]}, "TRUSTED_PROXIES"),
    ({"IPV6_PREFIX": 0}, "IPV6_PREFIX"),
    ({"RULES": [{"path": "/x", "rate": "often"}]}, "RULES"),
    ({"RULES": [{"path": "/x", "rate": "1/s", "key": "cookie:x"}]}, "RULES"),
    ({"RULES": [{"path": "/x", "rat": "1/s"}]}, "RULES"),
    ({"RULES": "/x"}, "RULES"),
    ({"POLICY": "/no/such/policy.toml"}, "POLICY"),
    ({"PREFIX": ""}, "PREFIX"),
    ({"ENABLED": "yes"}, "ENABLED"),
    ({"STROE": "memory://"}, "STROE"),
])
def test_bad_settings_are_named(value: dict[str, object], named: str) -> None:
    with pytest.raises(SettingsError, match=named) as caught:
        load_config(value)
    assert isinstance(caught.value, ImproperlyConfigured) and isinstance(caught.value, ConfigurationError)


def test_store_url_and_rule_objects() -> None:
    from ratewarden import Rule

    config = load_config({"STORE": "memory://", "RULES": [Rule("/a/**", "1/s")], "PREFIX": "site"})
    assert isinstance(config.limiter.store, MemoryStore) and config.limiter.prefix == "site"
    assert config.rules is not None and len(config.rules.match("GET", "/a/b")) == 1


def test_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\npath = "/mw/**"\nrate = "1/min"\n')
    with override_settings(RATEWARDEN={"RULES": [], "POLICY": str(policy)}):
        client = Client()
        assert [client.get("/mw/hello").status_code for _ in range(2)] == [200, 429]
    policy.write_text('[settings]\nshadow = true\n[[rules]]\npath = "/mw/**"\nrate = "1/min"\n')
    with pytest.raises(SettingsError, match="PolicyMiddleware"):
        load_config({"POLICY": str(policy)})


def test_middleware_without_rules_is_refused() -> None:
    with override_settings(RATEWARDEN={}), pytest.raises(ImproperlyConfigured, match="RULES"):
        RateLimitMiddleware(lambda request: None)


def test_config_is_rebuilt_when_the_setting_changes() -> None:
    first = current_config()
    assert current_config() is first
    with override_settings(RATEWARDEN={"ON_ERROR": "closed"}):
        assert current_config().limiter.on_error == "closed"
    assert current_config() is not first


def test_a_store_of_ones_own() -> None:
    """``STORE`` takes an object implementing the store protocols (``ratewarden.stores.protocols``),
    adapted as ``Limiter`` adapts it; an object implementing none is named with what it lacks."""
    from tests.stores.test_own_store import _OwnLocal

    config = load_config({"STORE": _OwnLocal(), "RULES": []})
    store = config.limiter.store
    assert store.local and store.can_block("hit") and type(store).__name__ == "_OwnLocal"
    assert [config.limiter.hit_sync("client", "2/min").allowed for _ in range(3)] == [True, True, False]
    with pytest.raises(SettingsError, match=r"STORE.*AsyncStore\), got <object"):
        load_config({"STORE": object()})
