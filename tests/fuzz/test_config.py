"""Fuzzing the configuration loaders: the policy file (TOML and YAML) and envoyproxy/ratelimit's YAML,
with documents drawn by hypothesis (random tables serialized, and the valid examples of
``examples/``, ``docs/`` and envoyproxy/ratelimit's README mutated: a value replaced, a field removed
or added, a line cut or repeated, a character changed).

Loading either succeeds or raises ``ConfigurationError`` (``PolicyError``, ``EnvoyConfigError``) whose
message says what is wrong: never another exception. ``tests/core/test_fuzz.py`` fuzzes the policy
text line by line; this adds whole documents, the files' loaders and the Envoy configuration.
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.errors import ConfigurationError
from ratewarden.policy import Policy, load_policy, parse_policy
from ratewarden.serve.envoy_config import (
    EnvoyConfigError,
    EnvoyDomain,
    load_envoy_configs,
    parse_envoy_config,
)
from tests.serve.readme_examples import ALL as ENVOY_EXAMPLES

from .conftest import fuzz
from .doors import ENVOY, POLICY

if sys.version_info >= (3, 11):
    import tomllib
else:  # the policy loader's own fallback (pyproject.toml: tomli before 3.11)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

# -- the valid documents mutated --------------------------------------------------------------------------


def _doc_blocks(language: str) -> list[str]:
    """The ``language`` code blocks of the documentation."""
    blocks = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        blocks += re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    return blocks


def _policies() -> list[dict[str, Any]]:
    """Every policy of ``examples/``, of the docs' TOML blocks (those that parse as TOML) and the doors'."""
    texts = [(ROOT / "examples" / "policy.toml").read_text(), POLICY, *_doc_blocks("toml")]
    found = [yaml.safe_load((ROOT / "examples" / "policy.yaml").read_text())]
    for text in texts:
        try:
            found.append(tomllib.loads(text))
        except tomllib.TOMLDecodeError:
            continue
    return [doc for doc in found if isinstance(doc, dict) and doc]


POLICIES = _policies()
ENVOY_TEXTS = [*ENVOY_EXAMPLES.values(), ENVOY]
ENVOYS = [yaml.safe_load(text) for text in ENVOY_TEXTS]

#: Values the schemas read: rates, durations, algorithms, key specs, paths, statuses, group names.
_WORDS = ["10/s", "5/min", "100/hour", "1/d", "0/s", "x/y", "10/s burst 5", "-1/s", "1s", "5m", "1h", "0", "-1s",
          "sliding_window", "fixed_window", "token_bucket", "gcra", "leaky_bucket", "nope", "ip", "identity",
          "bearer", "header:X-API-Key", "query:api_key", "header:", "/api/**", "/**", "re:(", "re:^/a$", "", "*",
          "5xx", "4xx", "401", "premium", "basic", "anonymous", "internal", "second", "minute", "hour", "day", "week",
          "month", "year", "SECOND", "decade", "GET", "POST"]
_keys = st.one_of(st.sampled_from(["version", "settings", "identity", "groups", "rules", "bans", "path", "rate",
                                   "limits", "key", "name", "algorithm", "domain", "descriptors", "value",
                                   "rate_limit", "unit", "requests_per_unit", "unlimited", "replaces",
                                   "shadow_mode", "quota_mode", "tiered", "bypass", "cost", "methods", "delay"]),
                  st.text(max_size=12))
_scalars = st.one_of(
    st.sampled_from(_WORDS), st.text(max_size=20), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.integers(-3, 300), st.floats(), st.none(),
)
values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(_keys, inner, max_size=4)), max_leaves=15)


def _containers(node: Any) -> Iterator[Any]:
    if isinstance(node, dict | list):
        yield node
        for child in node.values() if isinstance(node, dict) else node:
            yield from _containers(child)


def _parts(documents: list[Any]) -> list[Any]:
    """Every value of ``documents``, at any depth: what a field may be given instead of its own."""
    out = []
    for document in documents:
        for node in _containers(document):
            out += list(node.values()) if isinstance(node, dict) else node
    return out


@st.composite
def mutated(draw: st.DrawFn, documents: list[Any]) -> Any:
    """One of ``documents`` with one to three changes, each to a table or list anywhere in it: a value
    replaced (by a random one, or by a value from elsewhere in the documents), a field added, a field
    or item removed."""
    document = copy.deepcopy(draw(st.sampled_from(documents)))
    borrowed = st.sampled_from(_parts(documents)).map(copy.deepcopy)
    for _ in range(draw(st.integers(1, 3))):
        node = draw(st.sampled_from(list(_containers(document))))
        names = list(node) if isinstance(node, dict) else list(range(len(node)))
        change = draw(st.sampled_from(["replace", "borrow", "borrow", "add", "remove"]))
        value = draw(values if change in ("replace", "add") else borrowed)
        if change == "remove" and names:
            del node[draw(st.sampled_from(names))]
        elif change in ("replace", "borrow") and names:
            node[draw(st.sampled_from(names))] = value
        elif isinstance(node, dict):
            node[draw(_keys)] = value
        else:
            node.insert(draw(st.integers(0, len(node))), value)
    return document


def _text_mutated(texts: list[str]) -> st.SearchStrategy[str]:
    """One of ``texts`` with lines removed or repeated, or characters changed."""

    @st.composite
    def build(draw: st.DrawFn) -> str:
        lines = draw(st.sampled_from(texts)).splitlines()
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, max(0, len(lines) - 1)))
            change = draw(st.sampled_from(["remove", "repeat", "character", "indent"]))
            if not lines:
                break
            if change == "remove":
                del lines[at]
            elif change == "repeat":
                lines.insert(at, lines[at])
            elif change == "indent":
                lines[at] = draw(st.sampled_from(["", " ", "  ", "    ", "\t"])) + lines[at].lstrip()
            else:
                line = lines[at]
                cut = draw(st.integers(0, len(line)))
                lines[at] = line[:cut] + draw(st.text(max_size=3)) + line[cut + draw(st.integers(0, 2)):]
        return "\n".join(lines) + "\n"

    return build()


# -- serializing ------------------------------------------------------------------------------------------


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, but for DEL, which TOML escapes too)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if value is None:  # TOML has no null: the empty string stands in
        return '""'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f"{_toml_string(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"


def to_toml(document: dict[Any, Any]) -> str:
    """``document`` as TOML: each top-level field a line, tables inline."""
    return "".join(f"{_toml_string(str(key))} = {_toml_value(value)}\n" for key, value in document.items())


def to_yaml(document: Any) -> str:
    return yaml.safe_dump(document, allow_unicode=True, sort_keys=False)


# -- the property -----------------------------------------------------------------------------------------


def loads_or_refuses(load: Callable[[], Any]) -> Any:
    """``load()``'s result, or ``None`` when it raised ``ConfigurationError`` saying what is wrong; any
    other exception fails the test."""
    try:
        return load()
    except ConfigurationError as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        problems = getattr(exc, "problems", None)
        if problems is not None:
            assert problems and all(problem.message for problem in problems), problems
        return None


_tables = st.dictionaries(_keys, values, max_size=6)


@fuzz(150)
@given(st.one_of(mutated(POLICIES), mutated(POLICIES), _tables), st.sampled_from(["toml", "yaml"]))
def test_policy_documents(document: dict[Any, Any], format: str) -> None:
    text = to_toml(document) if format == "toml" else to_yaml(document)
    found = loads_or_refuses(lambda: parse_policy(text, format, f"fuzz.{format}"))
    assert found is None or isinstance(found, Policy)


@fuzz(100)
@given(st.one_of(_text_mutated([(ROOT / "examples" / "policy.toml").read_text(), POLICY]).map(lambda t: (t, "toml")),
                 _text_mutated([(ROOT / "examples" / "policy.yaml").read_text()]).map(lambda t: (t, "yaml"))))
def test_policy_files_mutated_line_by_line(document: tuple[str, str]) -> None:
    """The example files, changed as text, loaded from a file (``load_policy``, as ``serve`` does)."""
    text, format = document
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"policy.{format}"
        path.write_text(text, encoding="utf-8")
        found = loads_or_refuses(lambda: load_policy(path))
    assert found is None or isinstance(found, Policy)


@fuzz(150)
@given(st.one_of(mutated(ENVOYS), mutated(ENVOYS), _tables, values).map(to_yaml) | _text_mutated(ENVOY_TEXTS))
def test_envoy_documents(text: str) -> None:
    found = loads_or_refuses(lambda: parse_envoy_config(text, "fuzz.yaml"))
    assert found is None or isinstance(found, EnvoyDomain)


@fuzz(60)
@given(st.lists(st.one_of(mutated(ENVOYS), st.sampled_from(ENVOYS)).map(to_yaml), min_size=2, max_size=3), st.booleans())
def test_envoy_files_of_one_domain_merged_or_refused(texts: list[str], merge: bool) -> None:
    """Several files (often of one domain: the mutations keep it), loaded as ``serve`` loads them,
    merged or refused."""
    with tempfile.TemporaryDirectory() as directory:
        paths = [Path(directory) / f"config-{i}.yaml" for i in range(len(texts))]
        for path, text in zip(paths, texts, strict=True):
            path.write_text(text, encoding="utf-8")
        found = loads_or_refuses(lambda: load_envoy_configs(paths, merge))
    assert found is None or all(isinstance(domain, EnvoyDomain) for domain in found.values())


def test_the_serializer_round_trips() -> None:
    """``to_toml`` writes what tomllib reads back (nulls as empty strings)."""
    document = {"a": 1, "b": [1.5, "x\x7f\"\\\n", True, None], "c": {"d": {"e": []}}, "": "empty key"}
    assert tomllib.loads(to_toml(document)) == {**document, "b": [1.5, "x\x7f\"\\\n", True, ""]}
    assert all(isinstance(doc, dict) for doc in POLICIES) and len(POLICIES) >= 3
    for document in POLICIES[:3]:
        assert isinstance(parse_policy(to_toml(document), "toml"), Policy)


# -- found by the properties above ------------------------------------------------------------------------

_DEEP = 1000  # levels: past the interpreter's recursion limit (1000) for PyYAML's composer


def _nested_descriptors(depth: int) -> str:
    """A valid configuration whose descriptors nest ``depth`` levels deep (flow style)."""
    return ("domain: deep\ndescriptors: " + "[{key: k, descriptors: " * depth
            + "[{key: last, rate_limit: {unit: second, requests_per_unit: 1}}]" + "}]" * depth + "\n")


@pytest.mark.parametrize("text", ["[" * _DEEP, _nested_descriptors(300)], ids=["brackets", "descriptors"])
def test_deeply_nested_envoy_yaml_is_an_envoy_config_error(text: str) -> None:
    with pytest.raises(EnvoyConfigError):
        parse_envoy_config(text, "deep.yaml")


def test_serve_refuses_a_deeply_nested_file_with_a_message(tmp_path: Path) -> None:
    config = tmp_path / "deep.yaml"
    config.write_text("[" * _DEEP + "\n")
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", str(config), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
