"""No import cycles among ratewarden's modules, read from the source's AST.

The graph has an arrow for every ``import``/``from`` of a ratewarden module: at the top of a file,
inside a function (where a cycle hides easily) and under ``if TYPE_CHECKING:``. Importing
``a.b.c`` also runs the packages ``a.b`` (``__init__``) it passes through, unless the importer is
inside them already, so those get an arrow too. Imports by name at run time (``importlib``) are
data, not arrows: ``stores.urls.OPENERS`` names the stores that way.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "ratewarden"

#: Imports inside functions kept on purpose for an optional dependency, as (importer, imported):
#: not arrows of the graph.
OPTIONAL_LAZY = {
    # ``from . import _native``: the optional compiled table of the shared-memory store (a C
    # extension, absent from a pure-Python install), tried when a segment opens.
    ("ratewarden.stores.shared_memory.segment", "ratewarden.stores.shared_memory"),
}

#: Cycles still there, each the set of its modules; a cycle may shrink or go, never grow or appear.
KNOWN_CYCLES: list[frozenset[str]] = []

#: Modules whose cycles were taken apart: none of them may be in a cycle again.
FIXED = {
    "ratewarden.fastapi", "ratewarden.fastapi.routes", "ratewarden.fastapi.openapi", "ratewarden.fastapi.dependency",
    "ratewarden.charges", "ratewarden.stores", "ratewarden.stores.urls", "ratewarden.stores.memory",
    "ratewarden.stores.breaker", "ratewarden.stores.memcached", "ratewarden.stores.redis",
    "ratewarden.stores.redis.store", "ratewarden.stores.redis.topology", "ratewarden.stores.shared_memory",
    "ratewarden.stores.shared_memory.store", "ratewarden.stores.shared_memory.slots",
    "ratewarden.stores.shared_memory.operations", "ratewarden.stores.memcached.store",
    "ratewarden.stores.memcached.batches", "ratewarden.stores.memcached.cas", "ratewarden.stores.memcached.putbacks",
    "ratewarden.stores.memcached.locks", "ratewarden.stores.memcached.commands",
    "ratewarden.stores.memcached.connections", "ratewarden.stores.memcached.queues",
    "ratewarden.stores.memcached.protocol", "ratewarden.stores.memcached.encoding",
    "ratewarden.stores.memcached._aiomcache",
    # policy/: the middleware's Runtime and Plan live in policy/runtime.py, below the request context
    # and the admin operations; the identity memo is tiers.IdentityContext, below the request context.
    *(
        f"ratewarden.policy.{name}"
        for name in (
            "request_context", "keyspec", "loader", "asgi", "admin", "reload",
            "rule_section", "schema", "sections", "tiers", "runtime",
        )
    ),
}


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its file, and whether it is a package's ``__init__``."""
    found = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> Iterator[str]:
    """The ratewarden modules ``node`` names (a submodule for ``from package import submodule``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join([*here, *([node.module] if node.module else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base


def graph() -> dict[str, dict[str, int]]:
    """importer -> {imported: line}, for every import of a ratewarden module but ``OPTIONAL_LAZY``."""
    known = modules()
    edges: dict[str, dict[str, int]] = {name: {} for name in known}
    for module, (path, is_package) in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(module, is_package, node, set(known)):
                if not target.startswith(PACKAGE):
                    continue
                parts = target.split(".")
                for end in range(1, len(parts) + 1):  # the packages on the way run too
                    name = ".".join(parts[:end])
                    inside = module == name or module.startswith(name + ".")
                    if name in known and not inside and (module, name) not in OPTIONAL_LAZY:
                        edges[module].setdefault(name, node.lineno)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def describe(cycle: frozenset[str], edges: dict[str, dict[str, int]]) -> str:
    arrows = [f"  {a} -> {b} (line {line})" for a in sorted(cycle) for b, line in sorted(edges[a].items()) if b in cycle]
    return "\n".join([f"cycle of {len(cycle)}:", *arrows])


def test_the_graph_sees_imports_inside_functions() -> None:
    """The reader sees what a lazy import hides: it is an arrow."""
    edges = graph()
    assert "ratewarden.fastapi" in edges["ratewarden.cli.demo"]  # imported inside main()
    assert "ratewarden.fastapi" not in edges["ratewarden.errors"]  # OPTIONAL_LAZY
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [frozenset("abc")]


def test_no_new_import_cycle() -> None:
    edges = graph()
    new = [c for c in cycles(edges) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, "import cycles (move the shared piece below both sides):\n" + "\n".join(
        describe(c, edges) for c in new
    )


def test_fixed_modules_are_in_no_cycle() -> None:
    edges = graph()
    assert set(edges) >= FIXED
    tangled = {module for cycle in cycles(edges) for module in cycle} & FIXED
    assert not tangled, sorted(tangled)


def test_optional_lazy_imports_are_there() -> None:
    """Each allowed lazy import still exists (else its allowance would hide a future one)."""
    known = modules()
    for importer, target in OPTIONAL_LAZY:
        path, is_package = known[importer]
        lazy = {
            name
            for function in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in imported(importer, is_package, node, set(known))
        }
        assert target in lazy, (importer, target)


def test_every_store_opener_loads() -> None:
    """``stores.urls.OPENERS`` names real objects (the names are data, so no import checks them)."""
    import importlib.util

    from ratewarden.stores.urls import OPENERS, load

    extras = {"redis": "redis", "memcached": "aiomcache"}
    for scheme, name in OPENERS.items():
        extra = extras.get(scheme)
        if extra is not None and importlib.util.find_spec(extra) is None:
            continue
        assert callable(load(name)), scheme
    assert callable(load("shared_memory:segment_path"))
