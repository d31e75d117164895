"""rate-limiter-flexible behind fastify (Node): seed 001's own subject, as live rows beside ratewarden.

The app (``node/app.js``) and its exact dependencies (``node/package.json``, ``node/package-lock.json``)
ship in the package; ``npm ci`` installs them once per lock file into the user's cache
(``~/.cache/ratewarden/node/rlflx-<hash>``), never into the package. Each row is one Node process on the
run's own Redis or Redis Cluster, pinned, loaded by the same wrk rounds as the Python rows, and counting
its handler runs for the admitted / limit column. Where Node or npm is missing, where npm cannot install,
or where the store cannot run a client's limiter, the row is skipped with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .adapters.base import StoreSpec, Unsupported
from .drivers import live
from .drivers.live import LiveServer, ServerStartError

__all__ = ["BARE", "NODE_DIR", "PEERS", "NodeServer", "cache_dir", "describe", "install", "is_peer", "require_node",
           "server_class", "store_problem"]

#: Library name -> the Node client of its limiter (RateLimiterRedis, RateLimiterValkey, RateLimiterValkeyGlide).
PEERS: dict[str, str] = {"rlflx-ioredis": "ioredis", "rlflx-iovalkey": "iovalkey", "rlflx-glide": "valkey-glide"}
#: The same fastify app without a limiter: the baseline of the rows above (their ``x bare``).
BARE = "fastify-bare"
_LIMITERS = {"ioredis": "RateLimiterRedis", "iovalkey": "RateLimiterValkey", "valkey-glide": "RateLimiterValkeyGlide"}
# RateLimiterValkey's Lua script and RateLimiterValkeyGlide's function call server.call: Valkey 8 or later.
_VALKEY_ONLY = frozenset({"iovalkey", "valkey-glide"})
_STORES = ("redis", "redis-cluster")
NODE_DIR = Path(__file__).resolve().parent / "node"
_MIN_NODE = 20
_MARKER = ".ratewarden-installed"


def is_peer(library: str) -> bool:
    """Whether ``library`` is one of the rate-limiter-flexible rows or their fastify baseline."""
    return library in PEERS or library == BARE


def cache_dir() -> Path:
    """Where npm installs the app's dependencies: ``$XDG_CACHE_HOME/ratewarden/node`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ratewarden" / "node"


def require_node() -> tuple[str, str]:
    """``node`` and ``npm`` from PATH, Node 20 or later; :class:`Unsupported` saying what is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        raise Unsupported("node not found on PATH: install Node.js 20 or later (with npm) to run the "
                          "rate-limiter-flexible rows")
    if npm is None:
        raise Unsupported("npm not found on PATH (node is there): install npm to run the rate-limiter-flexible rows")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        major = int(version.lstrip("v").split(".", 1)[0])
    except ValueError:
        raise Unsupported(f"node --version said {version!r}, not a version") from None
    if major < _MIN_NODE:
        raise Unsupported(f"node {version} is older than the {_MIN_NODE} the rate-limiter-flexible rows need")
    return node, npm


def _digest() -> str:
    data = b"".join((NODE_DIR / name).read_bytes() for name in ("package.json", "package-lock.json"))
    return hashlib.sha256(data).hexdigest()[:12]


def install(log: Callable[[str], None] | None = None) -> Path:
    """The folder holding the app's ``node_modules``, installed once per lock file by ``npm ci`` (exact
    versions from the committed package-lock.json, no install scripts) into a temporary folder renamed
    into place, so an interrupted or concurrent install never leaves a half-filled one behind."""
    _, npm = require_node()
    target = cache_dir() / f"rlflx-{_digest()}"
    if (target / _MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(NODE_DIR / name, tmp / name)
        if log:
            log(f"rate-limiter-flexible rows: npm ci into {target} (once per lock file)")
        cmd = [npm, "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise Unsupported("npm ci took over 15 minutes (is the npm registry reachable?)") from None
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).split())[-400:]
            raise Unsupported(f"npm ci failed (exit {done.returncode}): {tail}")
        (tmp / _MARKER).write_text(_digest() + "\n", encoding="utf-8")
        if target.exists() and not (target / _MARKER).exists():
            shutil.rmtree(target, ignore_errors=True)  # left by hand, or by an older layout
        try:
            tmp.rename(target)
        except OSError:
            if not (target / _MARKER).exists():  # not another run's finished install either
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def store_problem(client: str, store: StoreSpec) -> str:
    """Why ``client``'s limiter cannot run on ``store`` ("" when it can): these rows run on the seed's
    stores only, and RateLimiterValkey and RateLimiterValkeyGlide run Lua that calls ``server.call``,
    which Redis lacks and Valkey 8 has."""
    if store.kind not in _STORES:
        return f"rate-limiter-flexible runs here on redis or redis-cluster (the seed's stores), not {store.kind}"
    if client not in _VALKEY_ONLY:
        return ""
    import redis

    host, port = store.host_port
    with redis.Redis(host, port, socket_timeout=5, socket_connect_timeout=5, decode_responses=True) as r:
        info = r.info("server")
    name = str(info.get("server_name", "redis"))
    version = str(info.get("valkey_version") or info.get("redis_version", "?"))
    major = version.split(".", 1)[0]
    if name == "valkey" and major.isdigit() and int(major) >= 8:
        return ""
    return (f"{_LIMITERS[client]} ({client}) runs Lua that calls server.call, which needs Valkey 8 or later; "
            f"this store is {name} {version}: give a Valkey server with --redis-url or --redis-cluster-url")


def describe() -> str:
    """The versions these rows run (for the reports' method notes)."""
    packages = json.loads((NODE_DIR / "package-lock.json").read_text(encoding="utf-8"))["packages"]
    names = ("fastify", "rate-limiter-flexible", "ioredis", "iovalkey", "@valkey/valkey-glide")
    found = ", ".join(f"{n} {packages[f'node_modules/{n}']['version']}" for n in names
                      if f"node_modules/{n}" in packages)
    return (f"one Node process ({found}; npm ci from the committed lock file), a global preHandler consuming "
            "1 point per request keyed on X-Client-ID, fastify's logger off; the same store, wrk rounds and "
            "pinning as the Python rows; admitted counted by the app's handlers; x bare against fastify-bare, "
            "the same Node app without a limiter, never against the Python bare app")


class NodeServer(LiveServer):
    """One rate-limiter-flexible row: ``node app.js`` in place of the uvicorn server, the same ``/__bench__``
    answers. Starting it checks the store, installs the dependencies (once) and raises
    :class:`Unsupported` with the reason when the row cannot run, so the row is skipped, not the run."""

    modules: Path | None = None

    @property
    def client(self) -> str:
        """The app's ``--client``: the limiter's Node client, ``none`` for the baseline."""
        return PEERS.get(self.library, "none")

    def command(self) -> tuple[list[str], dict[str, str] | None]:
        node, _ = require_node()
        assert self.modules is not None
        cmd = [node, str(NODE_DIR / "app.js"), "--client", self.client, "--port", str(self.port)]
        if self.client != "none":
            cmd += ["--store", self.store.kind, "--store-url", self.store.url, "--points", str(self.scenario.limit),
                    "--duration", str(self.scenario.window_s)]
        return cmd, {**os.environ, "NODE_PATH": str(self.modules / "node_modules"), "NODE_ENV": "production"}

    def start(self) -> None:
        if self.workers != 1:
            raise Unsupported("the rate-limiter-flexible rows run one Node process")
        problem = "" if self.client == "none" else store_problem(self.client, self.store)
        if problem:
            raise Unsupported(problem)
        self.modules = install(lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
        try:
            super().start()
        except ServerStartError as exc:
            said = [ln for ln in self.output().splitlines() if "failed at start:" in ln]
            raise Unsupported(f"the fastify app did not start: {said[-1] if said else exc}") from exc


def server_class(library: str) -> type[LiveServer]:
    """The live server that runs ``library``: Node for the rate-limiter-flexible rows, else uvicorn."""
    return NodeServer if is_peer(library) else live.LiveServer  # looked up now: the driver's, as it is
