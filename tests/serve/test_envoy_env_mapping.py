"""``--envoy-env``'s pieces on their own: the reference's settings table against its source (where the Go
module cache has it) and against docs/gateways/envoy.md's table; the store URL its backend settings
name; its runtime directory's layout; its stats keys, labels and counting rules (serve/reference_stats.py).
The whole, with real processes, is tests/serve/test_envoy_env.py."""

from __future__ import annotations

import argparse
import glob
import re
from pathlib import Path

import pytest

from ratewarden.errors import ConfigurationError
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.envoy_env import apply_envoy_env, store_url
from ratewarden.serve.envoy_runtime import RuntimeLayout
from ratewarden.serve.envoy_settings import SETTINGS, read_settings
from ratewarden.serve.reference_stats import increments, labels, near_threshold, sanitize, stat_key

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateways" / "envoy.md"


def test_every_setting_of_the_references_source_with_its_default() -> None:
    """``SETTINGS`` is envoyproxy/ratelimit's ``settings.go``: the same names, defaults and order."""
    found = sorted(glob.glob(str(Path.home() / "go/pkg/mod/github.com/envoyproxy/ratelimit@*/src/settings/settings.go")))
    if not found:
        pytest.skip("envoyproxy/ratelimit's source is not in the Go module cache (the gateway bench's go install puts it there)")
    source = Path(found[-1]).read_text()
    tags = re.findall(r'envconfig:"([A-Z_0-9]+)"(?: default:"([^"]*)")?', source)
    assert [(s.name, s.default) for s in SETTINGS.values()] == tags


def test_the_docs_have_one_row_per_setting() -> None:
    page = DOC.read_text()
    section = page[page.index("## Moving from envoyproxy/ratelimit"):]
    rows = re.findall(r"^\| `([A-Z_0-9]+)`", section, re.MULTILINE)
    assert sorted(rows) == sorted(SETTINGS), set(rows) ^ set(SETTINGS)


def values(**env: str) -> dict[str, object]:
    return read_settings({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", **env})[0]


@pytest.mark.parametrize(("env", "url"), [
    ({}, "redis://redis:6379/0?pool_size=10&cache=0"),
    ({"REDIS_AUTH": "s3cret", "REDIS_POOL_SIZE": "4"}, "redis://:s3cret@redis:6379/0?pool_size=4&cache=0"),
    ({"REDIS_AUTH": "app:p@ss", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem", "REDIS_TIMEOUT": "250ms"},
     "rediss://app:p%40ss@redis:6379/0?pool_size=10&timeout=0.25&connect_timeout=0.25&ssl_ca_certs=%2Fca.pem&cache=0"),
    ({"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH": "pw"},
     "redis+sentinel://s1:26379,s2:26379/mymaster?pool_size=10&sentinel_password=pw&cache=0"),
    ({"REDIS_TYPE": "cluster", "REDIS_URL": "n1:7000,n2:7001", "LOCAL_CACHE_SIZE_IN_BYTES": "1048576"},
     "redis+cluster://n1:7000,n2:7001?pool_size=10&cache=1"),
    ({"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "mc:11211"}, "memcached://mc:11211"),
    ({"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/run/redis/redis.sock", "REDIS_AUTH": "p@ss"},
     "unix://:p%40ss@/run/redis/redis.sock?pool_size=10&cache=0"),
    ({"REDIS_URL": "twemproxy:22121"}, "redis://twemproxy:22121/0?pool_size=10&cache=0&twemproxy=1"),
])
def test_the_store_url_of_the_backend_settings(env: dict[str, str], url: str) -> None:
    given = read_settings({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", **env})[1]
    assert store_url(values(**env), given) == url


@pytest.mark.parametrize(("env", "named"), [
    ({"REDIS_TYPE": "CLUSTER"}, "REDIS_SOCKET_TYPE=unix with REDIS_TYPE=CLUSTER: a unix socket reaches one server"),
    ({"REDIS_URL": "redis:6379"}, "REDIS_URL='redis:6379' with REDIS_SOCKET_TYPE=unix: must be the socket's absolute path"),
    ({"REDIS_TLS": "true"}, "REDIS_TLS=true with REDIS_SOCKET_TYPE=unix is not supported"),
    ({"REDIS_SOCKET_TYPE": "udp"}, "REDIS_SOCKET_TYPE='udp': must be tcp or unix"),
])
def test_a_unix_socket_setting_that_cannot_work_is_named(env: dict[str, str], named: str) -> None:
    settings, given = read_settings({"REDIS_SOCKET_TYPE": "unix", **env})
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        store_url(settings, given)


def test_options_given_win_and_defaults_are_the_references() -> None:
    args = argparse.Namespace(given={"store", "envoy_headers"}, store="memory://", envoy_headers="ratewarden")
    found = apply_envoy_env(args, {"REDIS_SOCKET_TYPE": "unix", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
                                   "RUNTIME_ROOT": "/tmp/current"})
    assert (args.store, args.envoy_headers) == ("memory://", "ratewarden")  # given: kept, REDIS_* not even read
    assert (args.http, args.grpc, args.log_level, args.log_format) == ("0.0.0.0:8080", "0.0.0.0:8081", "warning", "text")
    assert (args.envoy_charge, args.envoy_merge_domains) == ("each", False)
    assert found.reference.prometheus is None and found.runtime is not None
    defaults = argparse.Namespace(given=set())
    apply_envoy_env(defaults, {"RUNTIME_ROOT": "/tmp/current"})  # the reference's default: twemproxy's unix socket
    assert defaults.store == "unix:///var/run/nutcracker/ratelimit.sock?pool_size=10&cache=0&twemproxy=1"


def test_the_runtime_layout(tmp_path: Path) -> None:
    """RUNTIME_WATCH_ROOT=true: every file under <root>/<subdirectory>/<appdirectory>/ at any depth (and,
    as the reference's key prefix test has it, a file of the subdirectory named ``config.*``); dot files
    skipped with RUNTIME_IGNOREDOTFILES; false: the application directory itself."""
    config = tmp_path / "root" / "rl" / "config"
    (config / "nested").mkdir(parents=True)
    for path in (config / "a.yaml", config / "nested" / "b.yml", config / ".hidden", config.parent / "config.extra",
                 config.parent / "other.yaml"):
        path.write_text("domain: x\n")
    (config / "linked").symlink_to(config / "nested")  # a symlinked directory is not entered
    root = tmp_path / "root"
    names = [p.relative_to(root).as_posix() for p in RuntimeLayout(root, "rl").files()]
    assert names == ["rl/config/.hidden", "rl/config/a.yaml", "rl/config/nested/b.yml", "rl/config.extra"]
    assert [p.name for p in RuntimeLayout(root, "rl", ignore_dotfiles=True).files()] == ["a.yaml", "b.yml", "config.extra"]
    assert [p.name for p in RuntimeLayout(root, "rl", watch_root=False, ignore_dotfiles=True).files()] == ["a.yaml", "b.yml"]
    assert RuntimeLayout(root, "").files() == []  # the reference's nil loader


METRICS = """
domain: m
descriptors:
  - key: path
    value: /api*
    detailed_metric: true
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    value_to_metric: true
    descriptors:
      - key: plan
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: ip
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: svc
    value: pay*
    rate_limit: {unit: hour, requests_per_unit: 10}
"""


def test_stats_keys_and_labels_as_the_reference_names_them() -> None:
    config = parse_envoy_config(METRICS)
    assert stat_key(config, "m", (("svc", "payments"),), False) == "m.svc_pay*"  # the configuration's path
    assert stat_key(config, "m", (("user", "ann"), ("plan", "pro")), False) == "m.user_ann.plan"  # value_to_metric
    assert stat_key(config, "m", (("ip", "10.1.2.3"),), False) == "m.ip_10_1_2_3"  # detailed, sanitized
    assert stat_key(config, "m", (("path", "/api/v1"),), False) == "m.path_/api*"  # detailed + share_threshold
    assert stat_key(config, "m", (("a", "b:c|d"), ("e", "")), True) == "m.a_b_c_d.e"  # an override
    assert stat_key(config, "m", (("nothing", "here"),), False) == ""
    assert labels("m.user_ann.plan") == ("m", "user_ann", "plan")
    assert labels("m.a.b.c.d") == ("m", "a", "b")
    assert labels("m.svc_pay*") == ("m", "svc_pay*")
    assert sanitize("d.k_192.168.0.1:80") == "d.k_192_168_0_1_80"


def test_counting_rules_and_the_float32_near_threshold() -> None:
    assert near_threshold(90, 0.7) == 63  # float32, as the reference: float64 would say 62
    assert increments(5, 0, 1, False, 0.8) == {"total_hits": 1, "within_limit": 1}
    assert increments(5, 4, 1, False, 0.8) == {"total_hits": 1, "within_limit": 1, "near_limit": 1}
    assert increments(5, 3, 3, False, 0.8) == {"total_hits": 3, "over_limit": 1, "near_limit": 1}
    assert increments(5, 5, 2, True, 0.8) == {"total_hits": 2, "over_limit": 2, "shadow_mode": 2}
    assert increments(5, 0, 0, False, 0.8) == {}
