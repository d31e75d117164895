"""What users install: the wheel's tag and metadata, one version everywhere, and the build's
pure-Python fallback on a machine that cannot compile.

The installed-wheel checks run in the wheel passes of ``make test`` (``RATEWARDEN_EXPECT_INSTALLED=1``).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import ratewarden

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = os.environ.get("RATEWARDEN_EXPECT_INSTALLED") == "1"
installed_only = pytest.mark.skipif(not INSTALLED, reason="checks the installed wheel (make test's wheel passes)")


def _wheel_tag() -> str:
    abi = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return f"{abi}-{abi}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


def test_one_version_everywhere() -> None:
    assert metadata.version("ratewarden") == ratewarden.__version__
    out = subprocess.run([sys.executable, "-m", "ratewarden.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"ratewarden {ratewarden.__version__} (")


@installed_only
def test_tests_import_the_installed_wheel_not_src() -> None:
    package = Path(ratewarden.__file__).resolve().parent
    assert ROOT not in package.parents, package
    assert ratewarden.COMPILED


@installed_only
def test_wheel_tag_matches_this_interpreter() -> None:
    """A compiled wheel only installs on the CPython it was built for: its tag says which."""
    wheel = metadata.distribution("ratewarden").read_text("WHEEL") or ""
    fields = dict(line.split(": ", 1) for line in wheel.splitlines() if ": " in line)
    assert fields["Root-Is-Purelib"] == "false"
    assert fields["Tag"] == _wheel_tag()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    extensions = [f for f in metadata.files("ratewarden") or [] if f.name.endswith(".so")]
    assert extensions and all(f.name.endswith(suffix) for f in extensions), (suffix, extensions)


@installed_only
def test_wheel_ships_data_and_licence_and_no_tests() -> None:
    files = {str(f) for f in metadata.files("ratewarden") or []}
    assert "ratewarden/py.typed" in files
    assert "ratewarden/stores/lua/check.lua" in files
    assert any(f.endswith("licenses/LICENSE") for f in files), sorted(files)
    assert not any(f.startswith(("tests/", "bench-results/", "scripts/")) for f in files)
    meta = metadata.metadata("ratewarden")
    assert meta["License-Expression"] == "MIT"
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])


def _build_wheel(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``pip wheel`` of this tree with this interpreter's setuptools and mypy (no download)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
    )


def test_without_a_c_compiler_the_build_falls_back_to_pure_python_and_says_so(tmp_path: Path) -> None:
    done = _build_wheel(tmp_path / "pure", CC="false", RATEWARDEN_REQUIRE_COMPILED="")
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if "building the pure-Python package" in line]
    assert len(said) == 1 and "no working C compiler" in said[0], said
    (wheel,) = (tmp_path / "pure").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")  # installable anywhere, and says what it is
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "ratewarden/stores/memory.py" in names and not any(n.endswith(".so") for n in names)


def test_require_compiled_turns_the_fallback_into_an_error(tmp_path: Path) -> None:
    done = _build_wheel(tmp_path / "none", CC="false", RATEWARDEN_REQUIRE_COMPILED="1")
    assert done.returncode != 0
    assert "RATEWARDEN_REQUIRE_COMPILED is set" in done.stdout + done.stderr
    assert not list((tmp_path / "none").glob("*.whl"))


@installed_only
def test_the_wheel_has_the_compiled_front_door_when_cargo_was_there() -> None:
    """The build records what became of ``ratewarden._front`` (setup.py): make test builds its wheels
    with rustup's cargo on PATH (the Makefile), so a wheel without the front door fails here unless
    cargo is missing too and the wheel says so."""
    package = Path(ratewarden.__file__).resolve().parent
    record = package / "_front_build.txt"
    assert record.is_file(), f"the wheel does not say what became of the front door: {sorted(p.name for p in package.iterdir())}"
    outcome = record.read_text(encoding="utf-8").strip()
    built = sorted(p.name for p in package.glob("_front.*") if p.suffix in (".so", ".pyd"))
    if shutil.which("cargo") is None and outcome.startswith("no cargo on PATH"):
        assert built == [], built
        with pytest.raises(ImportError):
            importlib.import_module("ratewarden._front")
        return
    assert outcome == "compiled", f"cargo was there, and the front door was not built: {outcome}"
    front = importlib.import_module("ratewarden._front")
    assert Path(front.__file__ or "").resolve().parent == package, front.__file__
    assert hasattr(front, "Front") and built, built


def _source_copy(dst: Path) -> Path:
    """What ``pip install -e`` builds from: the build files, the package and the crate (no build output)."""
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dst / name)
    skip = shutil.ignore_patterns("__pycache__", "*.so", "_front_build.txt", "target")
    shutil.copytree(ROOT / "src" / "ratewarden", dst / "src" / "ratewarden", ignore=skip)
    shutil.copytree(ROOT / "rust", dst / "rust", ignore=skip)
    return dst


def _build_editable(tree: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """setuptools' PEP 660 hook, as ``pip install -e`` calls it (no mypyc: editable builds stay pure Python)."""
    code = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    return subprocess.run([sys.executable, "-c", code, str(out)], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_without_cargo_the_build_leaves_out_the_front_door_and_says_why(tmp_path: Path) -> None:
    tree = _source_copy(tmp_path)
    package = tree / "src" / "ratewarden"
    stale = package / f"_front{sysconfig.get_config_var('EXT_SUFFIX')}"
    stale.write_bytes(b"left by an earlier build with cargo")
    done = _build_editable(tree, tmp_path / "wheels", PATH="/usr/bin:/bin", RATEWARDEN_REQUIRE_FRONT="")
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "compiled front door (ratewarden._front) is not built" in line]
    assert len(said) == 1 and "no cargo on PATH" in said[0] and "rustup" in said[0], said
    assert (package / "_front_build.txt").read_text(encoding="utf-8").startswith("no cargo on PATH")
    assert not stale.exists()  # the record and what imports agree
    assert list((tmp_path / "wheels").glob("*.whl"))

    required = _build_editable(tree, tmp_path / "required", PATH="/usr/bin:/bin", RATEWARDEN_REQUIRE_FRONT="1")
    assert required.returncode != 0
    assert "RATEWARDEN_REQUIRE_FRONT is set" in required.stdout + required.stderr
