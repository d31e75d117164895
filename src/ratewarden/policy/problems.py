"""Problems found in a policy document: ``Problem`` (one, as ``file:line: field: message``),
``PolicyError`` (all of them), and the ``Validator`` that collects them while the sections are
checked, so one pass reports every problem instead of the first.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError

__all__ = ["Locate", "PolicyError", "Problem", "Validator", "describe_value"]

Locate = Callable[[Sequence[str | int]], "int | None"]
"""Finds the line of a field path in the document (``None`` when unknown)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy file.

    Args:
        field: Where in the document, as a field path (``""`` for the whole document).
        message: What is wrong.
        line: The line number, when known.
        source: The file's name.
    """

    field: str
    message: str
    line: int | None = None
    source: str = "<policy>"

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class PolicyError(ConfigurationError):
    """A policy file that cannot be used.

    Args:
        problems: Every issue found.
    """

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class Validator:
    """Collects problems (with the line of the field when ``locate`` finds it) and checks shapes."""

    def __init__(self, locate: Locate, source: str) -> None:
        self.locate = locate
        self.source = source
        self.problems: list[Problem] = []

    def error(self, path: Sequence[str | int], message: str) -> None:
        line = None
        probe = list(path)
        while line is None and probe:
            line = self.locate(probe)
            probe.pop()
        for part in path:  # "bans: bans: ..." when a constructor names its section too
            if isinstance(part, str) and message.startswith(f"{part}: "):
                message = message[len(part) + 2:]
                break
        self.problems.append(Problem(_field_name(path), message, line, self.source))

    def sorted_problems(self) -> list[Problem]:
        """The problems in file order (those without a line first)."""
        return sorted(self.problems, key=lambda p: p.line or 0)

    def table(self, value: Any, path: list[str | int], allowed: Sequence[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, f"expected a table/mapping, got {describe_value(value)}")
            return {}
        for name in value:
            if name not in allowed:
                hint = difflib.get_close_matches(str(name), allowed, n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                self.error([*path, str(name)], f"unknown field{suggestion}; expected one of: {', '.join(allowed)}")
        return dict(value)

    def typed(self, table: Mapping[str, Any], name: str, path: list[str | int], kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = table.get(name, default)
        if value is default:
            return value
        if isinstance(value, bool) and kind is not bool and (not isinstance(kind, tuple) or bool not in kind):
            self.error([*path, name], f"expected {_type_name(kind)}, got {describe_value(value)}")
            return default
        if not isinstance(value, kind):
            self.error([*path, name], f"expected {_type_name(kind)}, got {describe_value(value)}")
            return default
        return value

    def attempt(self, path: list[str | int], fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (ValueError, TypeError) as exc:
            self.error(path, str(exc))
            return None


def _field_name(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def describe_value(value: Any) -> str:
    """How a value is described in a problem (\"the string 'x'\", \"a table\", ...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)
