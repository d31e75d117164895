"""``rediss://`` end to end: a redis-server with TLS (and client certificates) on a throwaway CA."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ratewarden import Limiter
from ratewarden.limits import make_limits
from ratewarden.stores.base import StoreError
from ratewarden.stores.redis import RedisStore
from tests.servers import HOST, Server, free_port, have, redis_server


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(name: str, cwd: Path) -> None:
    # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a CA needs key usage, certificates need
    # key identifiers.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-subj", f"/CN=ratewarden test {name}", "-days", "1",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash", cwd=cwd)


def _make_cert(name: str, ca: str, cwd: Path, extensions: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=cwd)
    (cwd / f"{name}.ext").write_text(
        f"{extensions}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=cwd)


@dataclass
class TLSRedis:
    dir: Path
    server: Server
    tls_port: int

    def url(self, **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"rediss://{HOST}:{self.tls_port}/0" + (f"?{query}" if query else "")

    def file(self, name: str) -> str:
        return str(self.dir / name)


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[TLSRedis]:
    if not (have("redis-server") and have("openssl")):
        pytest.skip("redis-server and openssl are needed (run scripts/install-system-deps.sh)")
    directory = Path(tempfile.mkdtemp(prefix="rw-tls-"))
    _make_ca("ca", directory)
    _make_ca("other-ca", directory)  # trusted by nobody: the "bad certificate" case
    _make_cert("server", "ca", directory, "subjectAltName=IP:127.0.0.1,DNS:localhost")
    _make_cert("client", "ca", directory, "extendedKeyUsage=clientAuth")
    tls_port = free_port()
    # The plain port is only for the readiness probe; the store talks to the TLS port.
    server = redis_server(
        directory, None,
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(directory / "server.crt"),
        "--tls-key-file", str(directory / "server.key"),
        "--tls-ca-cert-file", str(directory / "ca.crt"),
        "--tls-auth-clients", "optional",
    )
    server.start()
    yield TLSRedis(directory, server, tls_port)
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


async def _check(url: str, **options: float) -> None:
    store = RedisStore(url, timeout=options.get("timeout", 5.0))
    limiter = Limiter(store)
    key = f"tls-{uuid.uuid4().hex}"
    try:
        for expected in (2, 1, 0):
            decision = await limiter.hit(key, "3/min", algorithm="gcra")
            assert decision.allowed and decision.remaining == expected
        assert not (await limiter.hit(key, "3/min", algorithm="gcra")).allowed
    finally:
        await limiter.close()


async def test_rediss_with_ca_file(tls_redis: TLSRedis) -> None:
    await _check(tls_redis.url(ssl_ca_certs=tls_redis.file("ca.crt")))


async def test_rediss_with_client_certificate(tls_redis: TLSRedis) -> None:
    await _check(
        tls_redis.url(
            ssl_ca_certs=tls_redis.file("ca.crt"),
            ssl_certfile=tls_redis.file("client.crt"),
            ssl_keyfile=tls_redis.file("client.key"),
        )
    )


async def test_untrusted_server_certificate_is_a_clear_store_error(tls_redis: TLSRedis) -> None:
    store = RedisStore(tls_redis.url(ssl_ca_certs=tls_redis.file("other-ca.crt")), timeout=5)
    (limit,) = make_limits("3/min", "fixed_window")
    try:
        with pytest.raises(StoreError) as info:
            await store.hit([f"rw:{{tls|{uuid.uuid4().hex}}}:{limit.suffix}"], [limit], [1.0])
        message = str(info.value)
        assert f"127.0.0.1:{tls_redis.tls_port}" in message
        assert "certificate verify failed" in message.lower()
    finally:
        await store.close()


async def test_client_certificate_from_another_ca_is_refused(tls_redis: TLSRedis) -> None:
    directory = tls_redis.dir
    if not (directory / "stranger.crt").exists():
        _make_cert("stranger", "other-ca", directory, "extendedKeyUsage=clientAuth")
    url = tls_redis.url(
        ssl_ca_certs=tls_redis.file("ca.crt"),
        ssl_certfile=tls_redis.file("stranger.crt"),
        ssl_keyfile=tls_redis.file("stranger.key"),
    )
    store = RedisStore(url, timeout=5)
    (limit,) = make_limits("3/min", "fixed_window")
    try:
        with pytest.raises(StoreError, match=f"127.0.0.1:{tls_redis.tls_port}"):
            await store.hit([f"rw:{{tls|{uuid.uuid4().hex}}}:{limit.suffix}"], [limit], [1.0])
    finally:
        await store.close()


async def test_plain_redis_url_on_a_tls_port_is_a_store_error(tls_redis: TLSRedis) -> None:
    store = RedisStore(f"redis://{HOST}:{tls_redis.tls_port}/0", timeout=0.5, connect_timeout=0.5)
    (limit,) = make_limits("3/min", "fixed_window")
    try:
        with pytest.raises(StoreError, match=f"127.0.0.1:{tls_redis.tls_port}"):
            await store.hit([f"rw:{{tls|{uuid.uuid4().hex}}}:{limit.suffix}"], [limit], [1.0])
    finally:
        await store.close()


def test_missing_certificate_file_is_named() -> None:
    for option in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        with pytest.raises(ValueError, match=f"{option} file '/nonexistent/x.pem' does not exist"):
            RedisStore(f"rediss://{HOST}:6379/0?{option}=/nonexistent/x.pem")
