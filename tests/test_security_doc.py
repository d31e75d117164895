"""docs/security.md cannot drift from the tests that check it (issue 36): every row of its tables
names at least one test in its last column ("checked by"), and every test the page names exists (the
file, and the test function defined in it); the numbers it states beside a bound's constant, option
or name are that constant's value."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from ratewarden.algorithms.base import STEP_BACK
from ratewarden.caches import DEFAULT_BYTES
from ratewarden.serve import bounds, grpc, http_io, spoe
from ratewarden.stores import insurance

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "security.md"

#: A test the page names: a file under tests/, and optionally ``::test_name`` (parameters left off).
TEST_ID = re.compile(r"(tests/[\w/]+\.py)(?:::(test_\w+))?")
#: A test named alone in backticks (the file named elsewhere in its row).
BARE_TEST = re.compile(r"(?<![:\w])`(test_\w+)`")


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each Markdown table: its header cells and its rows' cells."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(\s*-+\s*\|)+", lines[i + 1]):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    assert line.startswith("|") and line.endswith("|"), line
    return [cell.strip() for cell in line[1:-1].split("|")]


@functools.cache
def _defined(path: str) -> frozenset[str]:
    """The test functions a test file defines at module level (``def``, or a name bound to one)."""
    tree = ast.parse((ROOT / path).read_text(), path)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(name for name in names if name.startswith("test_"))


def _missing(path: str, name: str | None) -> str | None:
    """Why ``path::name`` is no test of the repository, or ``None``."""
    if not (ROOT / path).is_file():
        return f"{path}: no such file"
    defined = _defined(path)
    if name is None:
        return None if defined else f"{path}: defines no test"
    return None if name in defined else f"{path}::{name}: no such test in the file"


def test_the_page_has_its_tables() -> None:
    tables = _tables(PAGE.read_text())
    assert len(tables) == 5, [header for header, _ in tables]
    assert sum(len(rows) for _, rows in tables) >= 50


def test_every_row_names_a_test_that_exists() -> None:
    problems = []
    for header, rows in _tables(PAGE.read_text()):
        assert header[-1] == "checked by", header
        for row in rows:
            assert len(row) == len(header), f"a row of {len(row)} cells under {header}: {row[:2]}"
            where = " | ".join(row[:2])
            named = TEST_ID.findall(row[-1])
            if not named:
                problems.append(f"{where}: names no test in its last column")
            files = {path for path, _ in TEST_ID.findall(" ".join(row))}
            for path, name in TEST_ID.findall(" ".join(row)):
                why = _missing(path, name or None)
                if why:
                    problems.append(f"{where}: {why}")
            for name in BARE_TEST.findall(" ".join(row)):  # a test named alone: in a file its row names
                if not any(name in _defined(path) for path in files if (ROOT / path).is_file()):
                    problems.append(f"{where}: {name} is defined in none of {sorted(files)}")
    assert not problems, "\n".join(problems)


def test_every_test_named_in_the_prose_exists() -> None:
    text = "\n".join(line for line in PAGE.read_text().splitlines() if not line.startswith("|"))
    named = TEST_ID.findall(text)
    assert named
    problems = [why for path, name in named if (why := _missing(path, name or None))]
    assert not problems, problems


def test_the_checker_finds_what_is_missing() -> None:
    assert _missing("tests/test_security_doc.py", "test_every_row_names_a_test_that_exists") is None
    assert _missing("tests/test_security_doc.py", "test_nothing_of_the_kind") is not None
    assert _missing("tests/no_such_file.py", None) is not None
    assert _missing("tests/serve/test_front_http.py", "test_http_oversized_headers_are_431") is None  # bound by name
    table = "| a | checked by |\n|---|---|\n| x | `tests/test_security_doc.py::test_missing` |\n"
    ((header, rows),) = _tables(table)
    assert header == ["a", "checked by"] and TEST_ID.findall(rows[0][-1]) == [("tests/test_security_doc.py", "test_missing")]


# -- the numbers beside their constants ----------------------------------------------------------------------

UNITS = {"MiB": 1 << 20, "KiB": 1 << 10, "B": 1, "s": 1}
#: The constants the page names in backticks, beside the number it states for them.
CONSTANTS: dict[str, float] = {
    **{name: getattr(bounds, name) for name in bounds.__all__ if isinstance(getattr(bounds, name), (int, float))},
    "MAX_CONCURRENT_RPCS": grpc.MAX_CONCURRENT_RPCS,
}
#: Options the page names in backticks, followed by their default.
OPTIONS: dict[str, float] = {
    "--grpc-timeout": bounds.GRPC_TIMEOUT,
    "--grpc-handshake-timeout": bounds.GRPC_HANDSHAKE_TIMEOUT,
    "--grpc-max-message-size": bounds.GRPC_MAX_MESSAGE_SIZE,
    "--grpc-max-connections": bounds.GRPC_MAX_CONNECTIONS,
}
NUMBER = r"(\d[\d,]*(?:\.\d+)?)(?:\s(MiB|KiB|B|s)\b)?"


def _value(number: str, unit: str | None) -> float:
    return float(number.replace(",", "")) * UNITS.get(unit or "", 1)


def _size(value: float) -> str:
    """``value`` bytes as the page writes them: ``32 MiB``, ``64 KiB``, ``512 B``."""
    for unit in ("MiB", "KiB"):
        if value >= UNITS[unit] and value % UNITS[unit] == 0:
            return f"{value // UNITS[unit]:,.0f} {unit}"
    return f"{value:,.0f} B"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _seconds(value: float) -> str:
    return f"{value:g} s"


TIMES = "\N{MULTIPLICATION SIGN}"

#: Bounds the page states in words (the text as it must appear, from the constants' values).
PHRASES = [
    f"HELLO {_seconds(bounds.SPOE_TIMEOUT_HELLO)}, frame {_seconds(bounds.SPOE_TIMEOUT_FRAME)}, "
    f"idle {_seconds(bounds.SPOE_TIMEOUT_IDLE)}, {_count(bounds.SPOE_MAX_CONNECTIONS)} connections, "
    f"{_size(spoe.MAX_BUFFERED)} of unread answers per connection",
    f"HELLO within {_seconds(bounds.SPOE_TIMEOUT_HELLO)}, a frame finished within {_seconds(bounds.SPOE_TIMEOUT_FRAME)}, "
    f"the next within {_seconds(bounds.SPOE_TIMEOUT_IDLE)}",
    f"{_seconds(bounds.HTTP_TIMEOUT)} per request, {_size(bounds.HTTP_MAX_HEADER_SIZE)} head, "
    f"{_count(bounds.HTTP_MAX_CONNECTIONS)} connections per worker",
    f"per worker: {_count(bounds.HTTP_MAX_CONNECTIONS)} connections, {_seconds(bounds.HTTP_TIMEOUT)}, "
    f"{_size(bounds.HTTP_MAX_HEADER_SIZE)}; keep-alive {_seconds(bounds.HTTP_TIMEOUT_KEEP_ALIVE)}",
    f"closes {_seconds(bounds.HTTP_TIMEOUT_KEEP_ALIVE)} after its last answer",
    f"{_count(bounds.MAX_DESCRIPTORS)} descriptors, {_count(bounds.MAX_ENTRIES)} entries, "
    f"{_size(bounds.GRPC_MAX_MESSAGE_SIZE)}",
    f"{_count(bounds.GRPC_MAX_PENDING)} queued per worker (and {_size(bounds.GRPC_MAX_PENDING_BYTES)} of them)",
    f"{_count(spoe.MAX_IN_FLIGHT)} messages and {_size(bounds.SPOE_MAX_BYTES_IN_FLIGHT)} a connection",
    f"that has {_size(bounds.SPOE_MAX_BYTES_IN_FLIGHT)} of NOTIFY frames or {_count(spoe.MAX_IN_FLIGHT)} messages",
    f"once the worker's connections hold {_size(bounds.SPOE_MAX_BYTES)}",
    f"more than {_seconds(bounds.SPOE_TIMEOUT_PROCESSING)} for its decision",
    f"at most {_count(spoe.MAX_FRAME_SIZE)}",
    f"{_size(http_io.MAX_BODY)} body",
    f"over {_size(http_io.MAX_BODY)} 413",
    f"{_size(DEFAULT_BYTES)} per cache",
    f"the {_count(insurance.PROTECTED)} kept for keys answered again",
    f"one of {_count(insurance.MARKS)} slots",
    f"{_count(insurance.ANSWERS)} keys {TIMES} {_size(insurance.ENTRY_BYTES)} of key and answer "
    f"({_size(insurance.ANSWER_BYTES)};",
    f"+ {_size(insurance.MARK_BYTES)} of marks; owed charges: {_count(insurance.OWED)} keys",
    f"more than {_seconds(STEP_BACK)} is dropped",
    f"at most {_count(grpc.MAX_CONCURRENT_RPCS)} calls a worker",
    f"{_count(grpc.MAX_CONCURRENT_RPCS)} calls {TIMES} `--grpc-max-message-size` ({_size(bounds.GRPC_MAX_MESSAGE_SIZE)}): "
    f"{_size(grpc.MAX_CONCURRENT_RPCS * bounds.GRPC_MAX_MESSAGE_SIZE)}",
]


@pytest.mark.parametrize("phrase", PHRASES)
def test_a_bound_stated_in_words_is_its_constants_value(phrase: str) -> None:
    assert phrase in " ".join(PAGE.read_text().split()), f"docs/security.md does not say {phrase!r}"


def test_a_number_beside_a_constant_or_option_is_its_value() -> None:
    text = PAGE.read_text()
    checked, problems = 0, []
    for name, value in CONSTANTS.items():
        for mention in re.finditer(rf"`{name}`", text):
            before = re.search(rf"{NUMBER}[^\d`|]*$", text[max(0, mention.start() - 80) : mention.start()])
            if before is None:
                problems.append(f"`{name}`: no number before it")
                continue
            checked += 1
            if _value(*before.groups()) != value:
                problems.append(f"`{name}` is {value}, the page says {before.group(0).strip()!r}")
    for option, value in OPTIONS.items():
        for after in re.finditer(rf"`{re.escape(option)}`[ ,(]+{NUMBER}", text):
            checked += 1
            if _value(after.group(1), after.group(2)) != value:
                problems.append(f"`{option}` defaults to {value}, the page says {after.group(0)!r}")
    assert not problems, problems
    assert checked >= 15, checked  # the page names them: a check that finds none checks nothing
