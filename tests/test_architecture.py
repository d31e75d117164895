"""docs/architecture.md: its example integration runs as written, and the layers it draws hold in
the import graph (a lower layer never imports a higher one)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from tests.test_import_cycles import graph

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

#: Top to bottom. The package's ``__init__`` is the facade re-exporting every layer, so no layer.
LAYERS = {
    "integrations": (
        "ratewarden.asgi", "ratewarden.fastapi", "ratewarden.starlette", "ratewarden.policy",
        "ratewarden.cli", "ratewarden.bench", "ratewarden.metrics", "ratewarden.wsgi", "ratewarden.django", "ratewarden.flask",
        "ratewarden.sanic", "ratewarden.litestar", "ratewarden.serve",
    ),
    "check and answer": ("ratewarden.enforcement",),
}


def layer_of(module: str) -> int:
    """2 for an integration, 1 for the check-and-answer layer, 0 for the model and the stores."""
    for rank, prefixes in zip((2, 1), LAYERS.values(), strict=True):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return 0


def test_the_example_integration_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert blocks, "docs/architecture.md has no ```python block"
    for index, block in enumerate(blocks):
        script = tmp_path / f"architecture_{index}.py"
        script.write_text(block)
        runpy.run_path(str(script), run_name="__main__")


def test_no_layer_imports_a_higher_one() -> None:
    upward = [
        f"{importer} -> {imported} (line {line})"
        for importer, targets in graph().items() if importer != "ratewarden"
        for imported, line in targets.items() if layer_of(imported) > layer_of(importer)
    ]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_the_layers_name_real_modules() -> None:
    modules = set(graph())
    for prefixes in LAYERS.values():
        for prefix in prefixes:
            assert any(m == prefix or m.startswith(prefix + ".") for m in modules), prefix


def test_only_the_cli_imports_the_bench_suite() -> None:
    """``bench/`` stays separable from the runtime (see "The benchmark suite" in the doc): only the
    ``bench`` command reaches it."""
    reaching = sorted(
        f"{importer} -> {imported}"
        for importer, targets in graph().items()
        if not importer.startswith(("ratewarden.bench", "ratewarden.cli"))
        for imported in targets if imported == "ratewarden.bench" or imported.startswith("ratewarden.bench.")
    )
    assert not reaching, reaching
