"""The Redis and Memcached examples of docs/stores.md run as written, against a real server (the URL
is swapped for the test server's)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests.servers import Memcached, RedisStandalone

DOC = Path(__file__).resolve().parents[2] / "docs" / "stores.md"


def _redis_examples() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    return [b for b in blocks if "RedisStore(" in b and "asyncio.run" in b]


def test_redis_examples_run(redis_standalone: RedisStandalone) -> None:
    examples = _redis_examples()
    assert len(examples) >= 2
    outputs = []
    for code in examples:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            # A timeout no busy machine reaches (the default 100 ms can pass while Redis waits for a core).
            url = f"{redis_standalone.url}?timeout=5"
            exec(compile(code.replace("redis://127.0.0.1:6379/0", url), str(DOC), "exec"), {})
        outputs.append(out.getvalue().split())
    assert outputs[0][:3] == ["True", "4", "0.0"]  # first example: five allowed, then a denial
    assert outputs[0][-3:-1] == ["False", "0"]
    assert outputs[1] == ["False", "2", "True"]  # refunds


def test_memcached_example_runs(memcached_server: Memcached) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    examples = [b for b in blocks if "MemcachedStore(" in b and "asyncio.run" in b]
    assert len(examples) == 1, "docs/stores.md has no runnable Memcached example"
    code = examples[0]
    assert "memcached://127.0.0.1:11211" in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("memcached://127.0.0.1:11211", memcached_server.url), str(DOC), "exec"), {})
    assert out.getvalue().splitlines() == ["True 2", "True 1", "True 0", "False 0"]  # as the page says
