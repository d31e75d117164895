"""Reading policy files: TOML (``tomllib``, or ``tomli`` before Python 3.11) and YAML (PyYAML,
the ``policy`` extra), with a line locator per format so validation errors name the line."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .problems import Locate, PolicyError, Problem
from .schema import Policy, require_limits, validate

__all__ = ["decode_policy", "load_policy", "parse_policy"]

_HEADER_RE = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY_RE = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_PART_RE = re.compile(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""")


def _toml_module() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading TOML policies on Python 3.10 needs tomli: pip install tomli") from None
    return tomli


def _dotted(text: str) -> list[str]:
    return [p[1:-1] if p[0] in "\"'" else p for p in _PART_RE.findall(text)]


def toml_locator(text: str) -> Locate:
    """Map field paths (``["rules", 2, "rate"]``) to the line that sets them."""
    lines: dict[tuple[str | int, ...], int] = {}
    counts: dict[tuple[str | int, ...], int] = {}
    table: tuple[str | int, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER_RE.match(line)
        if header and not line.lstrip().startswith("#"):
            parts = tuple(_dotted(header.group(2)))
            if header.group(1) == "[[":
                index = counts.get(parts, 0)
                counts[parts] = index + 1
                table = (*parts, index)
            else:
                # A sub-table of the latest array element: [rules.delay] after [[rules]].
                resolved: list[str | int] = []
                for part in parts:
                    resolved.append(part)
                    if tuple(resolved) in counts:
                        resolved.append(counts[tuple(resolved)] - 1)
                table = tuple(resolved)
            _record(lines, table, number)
            continue
        key = _KEY_RE.match(line)
        if key:
            _record(lines, (*table, *_dotted(key.group(1))), number)

    def locate(path: Sequence[str | int]) -> int | None:
        return lines.get(tuple(path))

    return locate


def _record(lines: dict[tuple[str | int, ...], int], path: tuple[str | int, ...], number: int) -> None:
    """Note where ``path`` and each table above it first appear: ``[[rule]]`` (a typo) is then
    found as ``rule``, not only as ``rule[0]``."""
    for end in range(1, len(path) + 1):
        lines.setdefault(path[:end], number)


def yaml_locator(text: str) -> Locate:
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lambda path: None

    def locate(path: Sequence[str | int]) -> int | None:
        node = root
        if node is None:
            return None
        for i, part in enumerate(path):
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if key_node.value == str(part):
                        if i == len(path) - 1:
                            return int(key_node.start_mark.line) + 1
                        node = value_node
                        break
                else:
                    return None
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
            else:
                return None
        return int(node.start_mark.line) + 1

    return locate


def parse_policy(text: str, format: str = "toml", source: str = "<policy>") -> Policy:
    """Parse and validate policy ``text`` (``format`` is ``"toml"`` or ``"yaml"``); every problem
    with the text raises ``PolicyError``.

    Args:
        text: The policy.
        format: ``"toml"`` or ``"yaml"``.
        source: Its name, for messages.
    """
    try:
        return _parse_policy(text, format, source)
    except RecursionError:  # the parsers recurse per nesting level: "[[[[..." thousands deep
        raise PolicyError([Problem("", f"invalid {format.upper()}: nested too deeply", None, source)]) from None


def _parse_policy(text: str, format: str, source: str) -> Policy:
    if format == "toml":
        toml = _toml_module()
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            line = getattr(exc, "lineno", None) or _line_from_message(str(exc))
            if line is None and "end of document" in str(exc):
                line = max(1, len(text.splitlines()))
            raise PolicyError([Problem("", f"invalid TOML: {exc}", line, source)]) from None
        return validate(data, toml_locator(text), source)
    if format == "yaml":
        try:
            import yaml
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError("YAML policies need PyYAML: pip install 'ratewarden[policy]'") from None
        if flow_depth(text) > MAX_DEPTH:
            # PyYAML's scanner is quadratic in flow nesting: refuse before it spends seconds.
            raise PolicyError([Problem("", f"invalid YAML: nested more than {MAX_DEPTH} levels deep", None, source)])
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            line, message = _yaml_problem(exc)
            raise PolicyError([Problem("", message, line, source)]) from None
        return validate(data if data is not None else {}, yaml_locator(text), source)
    raise ConfigurationError(f"unknown policy format {format!r}: use 'toml' or 'yaml'")


MAX_DEPTH = 64  # a policy needs a handful of levels


def flow_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting in ``text`` (brackets inside strings count too, which only
    matters past ``MAX_DEPTH`` of them)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def _yaml_problem(exc: Exception) -> tuple[int | None, str]:
    """PyYAML's multi-line error (with a source excerpt and a caret) as one line and its line
    number: ``invalid YAML (column 5): mapping values are not allowed here``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None)
    if problem:
        context = getattr(exc, "context", None)
        what = f"{problem} ({context})" if context else str(problem)
    else:  # e.g. a ReaderError (a control character): its text is already short
        what = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    if mark is None:
        return None, f"invalid YAML: {what}"
    return int(mark.line) + 1, f"invalid YAML (column {int(mark.column) + 1}): {what}"


def _line_from_message(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match.group(1)) if match else None


def load_policy(path: str | Path, *, allow_empty: bool = False) -> Policy:
    """Read and validate the policy file at ``path`` (``.toml``, ``.yaml`` or ``.yml``). A file
    that limits nothing (empty, or only ``bypass`` rules) is a ``PolicyError`` unless it sets
    ``allow_empty = true`` under ``[settings]`` or ``allow_empty`` is given: read while it was
    being written, it would otherwise switch every limit off.

    Args:
        path: The policy file.
        allow_empty: Accept a policy that limits nothing.
    """
    file = Path(path)
    policy_format(file)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise unreadable(file, exc) from None
    return decode_policy(data, file, allow_empty=allow_empty)


def policy_format(file: Path) -> str:
    """The format a policy file's name says (``"toml"`` or ``"yaml"``); ``PolicyError`` if neither.

    Args:
        file: The policy file.
    """
    suffix = file.suffix.lower()
    if suffix == ".toml":
        return "toml"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise PolicyError([Problem("", f"unknown policy file type {suffix or '(none)'!r}: use .toml, .yaml or .yml", None, str(file))])


def unreadable(file: Path, exc: OSError) -> PolicyError:
    """The error of a policy file that cannot be read.

    Args:
        file: The policy file.
        exc: Why it cannot be read.
    """
    return PolicyError([Problem("", f"cannot read policy file: {exc.strerror or exc}", None, str(file))])


def decode_policy(data: bytes, file: Path, *, allow_empty: bool = False) -> Policy:
    """Validate the bytes already read from the policy file ``file`` (``load_policy`` without the
    read, for a reloader that compared what it read across reads before using it).

    Args:
        data: The file's contents.
        file: The file they were read from: its name gives the format and names it in messages.
        allow_empty: Accept a policy that limits nothing.
    """
    format = policy_format(file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError([Problem(
            "", f"not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "policy files are TOML or YAML text", None, str(file),
        )]) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read translates newlines
    policy = parse_policy(text, format, str(file))
    if not allow_empty:
        require_limits(policy)
    return policy
