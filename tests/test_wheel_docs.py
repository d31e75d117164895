"""The installed package documents itself like the pure-Python source: every public class and
function has the same ``__doc__`` and ``inspect.signature`` (``help()``, IPython's ``?``, editors).

mypyc drops docstrings; the build writes them back into the generated C and ``ratewarden._mypyc``
gives compiled classes their signature (setup.py). The reference is the pure package itself: the
``.py`` files installed next to the compiled modules, imported as a second package
(``_ratewarden_pure``) that never loads an extension module. On the pure package (the editable
install) both sides are the same source, so the comparison holds trivially there.

A compiled function is a builtin: its signature comes from a ``__text_signature__``, which holds
no annotations, and only defaults that are constants; its parameters, their kinds and defaults are
compared. One whose default is not a constant (``fallback=client_ip``) is a Python wrapper with the
source's signature, compared in full, as are the ``Limiter`` coroutines before Python 3.12.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import pydoc
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import griffe
import pytest

import ratewarden

from .test_api_docs import SRC, public_api, rendered

TWIN = "_ratewarden_pure"
CONSTANTS = (str, int, float, bytes, bool, type(None))


class _PureSources(importlib.abc.MetaPathFinder):
    """Imports ``_ratewarden_pure.x`` from the installed ``ratewarden/x.py`` (never a ``.so``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if name != TWIN and not name.startswith(TWIN + "."):
            return None
        relative = Path(*name.split(".")[1:])
        package = self.root / relative / "__init__.py"
        if package.exists():
            return importlib.util.spec_from_file_location(
                name, package, submodule_search_locations=[str(package.parent)])
        module = (self.root / relative).with_suffix(".py")
        return importlib.util.spec_from_file_location(name, module) if module.exists() else None


@pytest.fixture(scope="module")
def twin() -> Iterator[types.ModuleType]:
    finder = _PureSources(Path(ratewarden.__file__).parent)
    sys.meta_path.insert(0, finder)
    try:
        yield importlib.import_module(TWIN)
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == TWIN or n.startswith(TWIN + ".")]:
            del sys.modules[name]


def public_objects() -> list[tuple[str, str, str]]:
    """(qualified name, defining module, name) of each public class and function."""
    package = griffe.load("ratewarden", search_paths=[str(SRC)], docstring_parser="google", resolve_aliases=True)
    return [
        (qualname, obj.module.path, obj.name)
        for qualname, obj in public_api(package, rendered())
        if obj.is_class or obj.is_function
    ]


PUBLIC = public_objects()


def pair(twin: types.ModuleType, module: str, name: str) -> tuple[Any, Any]:
    """The installed object and its pure-Python twin."""
    installed = getattr(importlib.import_module(module), name)
    pure = getattr(importlib.import_module(TWIN + module.removeprefix("ratewarden")), name)
    return installed, pure


def undocumentable(obj: object) -> bool:
    """A compiled ``async def`` before Python 3.12: a "Function compiled with mypyc" with no
    ``__dict__``, so no ``__doc__`` nor ``__signature__`` can be given to it."""
    return type(obj).__name__ == "Function compiled with mypyc" and sys.version_info < (3, 12)


def same_default(a: object, b: object) -> bool:
    """Equal, or the same kind of object (the twin's ``CLIENT_IP`` is another ``ClientIP``)."""
    if a is b or (isinstance(a, CONSTANTS) and a == b):
        return True
    return (type(a).__qualname__ == type(b).__qualname__
            and type(a).__module__.removeprefix("ratewarden") == type(b).__module__.removeprefix(TWIN))


def annotation(value: object, annotations: bool) -> object:
    """As written (a string), or evaluated (modules without ``from __future__ import annotations``)
    with the twin's module names read as the package's."""
    if not annotations or isinstance(value, str):
        return value if annotations else None
    return inspect.formatannotation(value).replace(TWIN + ".", "ratewarden.")


def described(signature: inspect.Signature, *, annotations: bool = True) -> list[tuple[Any, ...]]:
    return [
        (p.name, p.kind, annotation(p.annotation, annotations), p.default)
        for p in signature.parameters.values()
    ] + [("return", annotation(signature.return_annotation, annotations))]


def assert_same_signature(qualname: str, installed: Any, pure: Any, *, annotations: bool = True) -> None:
    try:
        expected = inspect.signature(pure)
    except ValueError:
        with pytest.raises(ValueError):
            inspect.signature(installed)
        return
    got = inspect.signature(installed)
    left, right = described(got, annotations=annotations), described(expected, annotations=annotations)
    assert len(left) == len(right), f"{qualname}: {got} != {expected}"
    for mine, theirs in zip(left, right, strict=True):
        assert mine[:-1] == theirs[:-1] and same_default(mine[-1], theirs[-1]), f"{qualname}: {got} != {expected}"


def test_the_api_is_walked() -> None:
    names = {qualname for qualname, _, _ in PUBLIC}
    assert {"ratewarden.Rule", "ratewarden.MemoryStore", "ratewarden.keys.header", "ratewarden.context_of"} <= names


@pytest.mark.parametrize(("qualname", "module", "name"), PUBLIC, ids=[q for q, _, _ in PUBLIC])
def test_same_doc_as_the_pure_package(twin: types.ModuleType, qualname: str, module: str, name: str) -> None:
    installed, pure = pair(twin, module, name)
    assert pure.__doc__, f"{qualname} has no docstring in the source"
    if undocumentable(installed):
        pytest.skip("a compiled async def has no __doc__ before Python 3.12")
    assert installed.__doc__ == pure.__doc__, qualname
    if isinstance(pure, type):  # and its methods and properties (what help() lists)
        for attr, member in vars(pure).items():
            if attr.startswith("_") or not isinstance(member, (types.FunctionType, property)):
                continue
            mine = installed.__dict__.get(attr)
            assert mine is not None, f"{qualname}.{attr}"
            assert undocumentable(mine) or mine.__doc__ == member.__doc__, f"{qualname}.{attr}"


@pytest.mark.parametrize(("qualname", "module", "name"), PUBLIC, ids=[q for q, _, _ in PUBLIC])
def test_same_signature_as_the_pure_package(twin: types.ModuleType, qualname: str, module: str, name: str) -> None:
    installed, pure = pair(twin, module, name)
    if undocumentable(installed):
        pytest.skip("a compiled async def has no __signature__ before Python 3.12")
    if isinstance(installed, type) or not isinstance(installed, types.BuiltinFunctionType):
        assert_same_signature(qualname, installed, pure)
        return
    # A compiled function: its text signature has the parameters, and defaults that are constants
    # (one with another default is a Python wrapper, compared above).
    defaults = [p.default for p in inspect.signature(pure).parameters.values() if p.default is not p.empty]
    assert all(isinstance(d, CONSTANTS) for d in defaults), f"{qualname}: {installed!r} should be a Python wrapper"
    assert_same_signature(qualname, installed, pure, annotations=False)


def public_callables() -> list[tuple[str, str, str, str | None]]:
    """(qualified name, module, name, method) of each public function and class, and of each public
    method of those classes (what ``help()`` lists)."""
    found: list[tuple[str, str, str, str | None]] = []
    for qualname, module, name in PUBLIC:
        found.append((qualname, module, name, None))
        try:
            obj = getattr(importlib.import_module(module), name, None)
        except ImportError:  # reported by the test itself
            continue
        if isinstance(obj, type):
            found += [(f"{qualname}.{attr}", module, name, attr) for attr, member in vars(obj).items()
                      if not attr.startswith("_") and callable(member) and not isinstance(member, type)]
    return found


CALLABLES = public_callables()


@pytest.mark.parametrize(("qualname", "module", "name", "method"), CALLABLES, ids=[c[0] for c in CALLABLES])
def test_every_public_callable_has_a_signature(twin: types.ModuleType, qualname: str, module: str, name: str,
                                               method: str | None) -> None:
    """``inspect.signature`` (``help()``, editors) works on the installed package wherever it does
    on the source: no "builtin has invalid signature"."""
    installed, pure = pair(twin, module, name)
    if method is not None:
        installed, pure = inspect.getattr_static(installed, method), inspect.getattr_static(pure, method)
        if isinstance(pure, (staticmethod, classmethod)):
            installed, pure = getattr(installed, "__func__", installed), pure.__func__
    try:
        expected = inspect.signature(pure)
    except (ValueError, TypeError):
        return
    got = inspect.signature(installed)
    if undocumentable(installed):
        return  # a compiled async def before 3.12 reads as "()": no __dict__ to tell it otherwise
    compiled_method = isinstance(installed, (types.MethodDescriptorType, types.ClassMethodDescriptorType))
    skip = 1 if method is not None and compiled_method else 0  # its $self or $cls: positional-only
    left, right = list(got.parameters.values())[skip:], list(expected.parameters.values())[skip:]
    assert [p.name for p in left] == [p.name for p in right], f"{qualname}: {got} != {expected}"
    for mine, theirs in zip(left, right, strict=True):
        assert mine.kind == theirs.kind and same_default(mine.default, theirs.default), f"{qualname}: {got} != {expected}"


@pytest.mark.parametrize("method", ["hit", "peek", "reset", "clear", "close", "check_store"])
def test_the_limiter_coroutines_are_documented_on_every_python(twin: types.ModuleType, method: str) -> None:
    """The main API shows its signature and docstring on every Python, 3.10 and 3.11 included."""
    installed, pure = (getattr(cls, method) for cls in pair(twin, "ratewarden.limiter", "Limiter"))
    assert installed.__doc__ == pure.__doc__ and installed.__doc__
    assert_same_signature(f"Limiter.{method}", installed, pure)
    assert inspect.iscoroutinefunction(installed)
    assert pydoc.render_doc(installed, renderer=pydoc.plaintext).count(pure.__doc__.strip().splitlines()[0]) == 1


def test_the_wrappers_call_the_compiled_functions() -> None:
    """A wrapper (``header``'s, ``Limiter.hit``'s) does what the function does."""
    key = ratewarden.keys.header("X-API-Key", hashed=False)
    assert key({"type": "http", "headers": [(b"x-api-key", b"k1")]}) == "x-api-key:k1"
    assert key({"type": "http", "headers": [], "client": ("192.0.2.1", 1)}) == "192.0.2.1"
    limiter = ratewarden.Limiter(ratewarden.MemoryStore())
    assert [limiter.hit_sync("a", "1/min").allowed for _ in range(2)] == [True, False]
    assert asyncio.run(limiter.peek("a", "1/min", algorithm="fixed_window")).remaining == 0


def test_help_shows_the_documentation() -> None:
    text = pydoc.render_doc(ratewarden.Rule, renderer=pydoc.plaintext)
    assert "A limit on the requests whose path matches" in text
    assert "key: 'KeyFunc' = <ratewarden.keys.ClientIP object" in text
    assert "applies(" in text and "Whether this rule's path and methods match the request." in text
    func = pydoc.render_doc(ratewarden.keys.header, renderer=pydoc.plaintext)
    assert ratewarden.keys.header.__doc__.strip().splitlines()[0] in func


def test_subclasses_keep_the_inspect_rules() -> None:
    """A subclass without ``__init__`` has its base's signature; one with its own, its own; an
    instance has none (a callable instance is its ``__call__``)."""

    class Plain(ratewarden.MemoryStore):
        pass

    class Own(ratewarden.MemoryStore):
        def __init__(self, size: int) -> None:
            super().__init__(size)

    assert inspect.signature(Plain) == inspect.signature(ratewarden.MemoryStore)
    assert list(inspect.signature(Own).parameters) == ["size"]
    assert not hasattr(ratewarden.keys.ClientIP(), "__signature__")
