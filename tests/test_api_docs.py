"""Every public class, function and method documents each of its parameters.

The API reference (docs/reference/*.md, mkdocstrings) renders the docstrings as griffe reads them
from ``src/``, with ``docstring_style: google`` (mkdocs.yml), so this test reads them the same way:
a parameter is documented when it has an entry in its docstring's ``Args:`` section. Reading the
source, not the imported objects, also holds for the compiled wheel, whose modules carry no
docstrings.

The public API: every name in the ``__all__`` of the modules a user imports (``ratewarden`` and its
top-level modules, every package's ``__init__``) and of the modules the reference renders whole;
deeper modules are a package's internals, reached through what its ``__init__`` exports. The
benchmark suite and the command lines (``ratewarden.bench``, ``*.cli``, ``ratewarden.cli.demo``) are
programs, not a library API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import griffe  # mkdocstrings' own reader (the dev extra installs it)
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"
NOT_API = ("ratewarden.bench", "ratewarden.cli", "ratewarden.cli.policy", "ratewarden.cli.demo")
ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


def documented(obj: griffe.Object) -> set[str]:
    """The names in ``obj``'s ``Args:`` sections (``*args`` counts as ``args``)."""
    if obj.docstring is None:
        return set()
    return {
        param.name.lstrip("*")
        for section in obj.docstring.parse("google")
        if section.kind is griffe.DocstringSectionKind.parameters
        for param in section.value
    }


def parameters(func: griffe.Function | griffe.Class) -> list[str]:
    """What a caller passes: not ``self``/``cls``, nor private ``_name`` parameters."""
    return [p.name for p in func.parameters if p.name not in ("self", "cls") and not p.name.startswith("_")]


def is_enum(cls: griffe.Class) -> bool:
    """An enum's members are values, not a constructor to document."""
    return any(str(base).split(".")[-1] in ENUM_BASES for c in (cls, *cls.mro()) for base in c.bases)


def problems(path: str, params: list[str], docs: set[str], own: set[str]) -> Iterator[str]:
    """What is undocumented in ``params``, and what ``own`` (this object's docstring) documents
    that the signature does not take."""
    missing = [p for p in params if p not in docs]
    if missing:
        yield f"{path}: no Args entry for {', '.join(missing)}"
    stale = sorted(own - set(params))
    if stale:
        yield f"{path}: Args documents {', '.join(stale)}, not in its signature"


def check_class(cls: griffe.Class) -> Iterator[str]:
    if is_enum(cls):
        return
    init = cls.members.get("__init__")
    # The class docstring documents the constructor (mkdocs.yml merges __init__'s into it).
    own = documented(cls) | (documented(init) if isinstance(init, griffe.Function) else set())
    yield from problems(cls.path, parameters(cls), own, own)
    for name in cls.all_members:  # inherited ones too (PolicyMiddleware's ``stats``)
        owner = next((c for c in (cls, *cls.mro()) if name in c.members), None)
        if owner is None or name.startswith("_"):
            continue
        member = owner.members[name]
        if member.is_alias or not member.is_function or "property" in member.labels:
            continue
        # A subclass's method may leave its parameters to the base class's documentation of the
        # same method (every Store subclass's ``hit`` to ``Store.hit``).
        inherited = set().union(
            *(documented(base.members[name]) for base in owner.mro() if name in base.members)
        )
        own = documented(member)
        yield from problems(member.path, parameters(member), own | inherited, own)


def rendered() -> set[str]:
    """What docs/reference/*.md render (``::: ratewarden.x.y`` lines)."""
    return {
        line.removeprefix(":::").strip()
        for page in REFERENCE.glob("*.md")
        for line in page.read_text().splitlines()
        if line.startswith(":::")
    }


def public_modules(package: griffe.Module, shown: set[str]) -> Iterator[griffe.Module]:
    modules = [package]
    while modules:
        module = modules.pop(0)
        modules.extend(module.modules.values())
        parts = module.path.split(".")
        if module.path.startswith(NOT_API) or any(part.startswith("_") for part in parts):
            continue
        if len(parts) <= 2 or module.is_init_module or module.path in shown:
            yield module


def public_api(package: griffe.Module, shown: set[str] = frozenset()) -> Iterator[tuple[str, griffe.Object]]:
    """(qualified name, object) for each public object, once, under the first module exporting it;
    then the objects the reference renders by their own path."""
    seen: set[str] = set()
    found = [
        (f"{module.path}.{name}", module.members[str(name)])
        for module in public_modules(package, shown)
        for name in module.exports or ()
    ]
    found += [(path, package[path.removeprefix(f"{package.path}.")]) for path in sorted(shown)]
    for qualname, obj in found:
        target = obj.final_target if obj.is_alias else obj
        if target.is_module or target.path in seen or not target.path.startswith(f"{package.path}."):
            continue
        seen.add(target.path)
        yield qualname, target


def undocumented(package: griffe.Module, shown: set[str] = frozenset()) -> list[str]:
    found = []
    for _, obj in public_api(package, shown):
        if obj.is_class:
            found.extend(check_class(obj))
        elif obj.is_function:
            own = documented(obj)
            found.extend(problems(obj.path, parameters(obj), own, own))
    return list(dict.fromkeys(found))  # a base's method is reported once, not once per subclass


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    return griffe.load("ratewarden", search_paths=[str(SRC)], docstring_parser="google", resolve_aliases=True)


def test_every_public_parameter_is_documented(package: griffe.Module) -> None:
    found = undocumented(package, rendered())
    assert not found, "undocumented parameters (add an Args: entry):\n" + "\n".join(found)


def test_the_walk_reaches_the_whole_api(package: griffe.Module) -> None:
    names = {qualname for qualname, _ in public_api(package, rendered())}
    for expected in (
        "ratewarden.Limiter",
        "ratewarden.stores.RedisStore",
        "ratewarden.stores.SharedMemoryStore",
        "ratewarden.stores.shared_memory.segment_path",
        "ratewarden.fastapi.RateLimit",
        "ratewarden.policy.Policy",
        "ratewarden.keys.header",
        "ratewarden.policy.Bans",
    ):
        assert expected in names
    assert not any(name.startswith("ratewarden.bench") for name in names)


CHECKED = '''
from enum import Enum

__all__ = ["Base", "Child", "Kind", "documented", "undocumented", "stale"]


class Kind(Enum):
    """An enum: not a callable to document."""
    A = "a"


def documented(key: str, *, cost: float = 1, **extra: str) -> None:
    """Charge ``key``.

    Args:
        key: who.
        cost: how much.
        **extra: anything else.
    """


def undocumented(key: str, cost: float = 1) -> None:
    """Charge ``key`` (named in the text, but with no Args entry for either)."""


def stale(key: str) -> None:
    """Charge.

    Args:
        key: who.
        amount: a parameter it no longer takes.
    """


class Base:
    """A base.

    Args:
        size: how big.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def hit(self, keys: list[str], costs: list[float]) -> None:
        """Charge.

        Args:
            keys: who.
            costs: how much.
        """


class Child(Base):
    """A child whose constructor takes an undocumented ``name``."""

    def __init__(self, size: int, name: str) -> None:
        super().__init__(size)

    def hit(self, keys: list[str], costs: list[float]) -> None:
        """Charge (documented by Base.hit)."""

    def peek(self, keys: list[str]) -> None:
        """Look."""
'''


def test_the_check_finds_an_undocumented_parameter() -> None:
    with griffe.temporary_visited_package("ratewarden", {"__init__.py": CHECKED}) as package:
        found = undocumented(package)
    assert found == [
        "ratewarden.Child: no Args entry for size, name",
        "ratewarden.Child.peek: no Args entry for keys",
        "ratewarden.undocumented: no Args entry for key, cost",
        "ratewarden.stale: Args documents amount, not in its signature",
    ]
