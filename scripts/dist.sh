#!/usr/bin/env bash
# Release artifacts: `python -m build` makes the sdist, then builds the wheel FROM that sdist (so
# the sdist is proven to build on its own) in an isolated environment, compiled with mypyc. Then
# twine checks the metadata and a few lines below check what each artifact holds.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
rm -rf dist
# The wheel is built from the unpacked sdist in a temporary folder: the clone's cargo target folder
# keeps the front door's cargo build from starting cold (setup.py).
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/build/cargo}
RATEWARDEN_REQUIRE_COMPILED=1 RATEWARDEN_REQUIRE_FRONT=1 "$py" -m build --outdir dist . >/tmp/ratewarden-dist.log 2>&1 \
  || { tail -40 /tmp/ratewarden-dist.log; exit 1; }
if grep -iE "deprecat" /tmp/ratewarden-dist.log; then
  echo "dist: the build printed deprecation warnings (above)"; exit 1
fi
"$py" -m twine check --strict dist/*
"$py" - <<'PY'
import sys, tarfile, zipfile
from pathlib import Path

import ratewarden

sdists, wheels = sorted(Path("dist").glob("*.tar.gz")), sorted(Path("dist").glob("*.whl"))
assert len(sdists) == 1 and len(wheels) == 1, (sdists, wheels)
version = ratewarden.__version__
abi = f"cp{sys.version_info[0]}{sys.version_info[1]}"
assert wheels[0].name.startswith(f"ratewarden-{version}-{abi}-{abi}-"), f"not a compiled wheel: {wheels[0].name}"
with tarfile.open(sdists[0]) as tf:
    sdist = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
with zipfile.ZipFile(wheels[0]) as zf:
    wheel = set(zf.namelist())
for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "setup.py",
             "src/ratewarden/py.typed", "src/ratewarden/stores/lua/check.lua", "rust/Cargo.toml", "rust/src/lib.rs"):
    assert name in sdist, f"sdist lacks {name}"
for name in ("ratewarden/py.typed", "ratewarden/stores/lua/check.lua", f"ratewarden-{version}.dist-info/licenses/LICENSE"):
    assert name in wheel, f"wheel lacks {name}"
stray = [n for n in wheel if n.startswith(("tests/", "scripts/", "docs/", "bench-results/", "rust/"))]
assert not any(n.startswith("rust/target/") for n in sdist), "sdist carries cargo's build output"
assert not stray, f"wheel carries files users do not need: {stray[:5]}"
extensions = [n for n in wheel if n.endswith(".so")]
assert extensions, "wheel has no compiled module"
front = [n for n in extensions if n.startswith("ratewarden/_front.")]
assert front, f"wheel lacks the compiled front door (ratewarden._front): {extensions}"
for path in (*sdists, *wheels):
    print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")
print(f"wheel: {len(extensions)} compiled modules ({front[0]}), {len(wheel)} files; sdist: {len(sdist)} files")
PY
