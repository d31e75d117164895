#!/usr/bin/env bash
# Tests what users install: builds the wheel the way pip does (isolated build, no optional
# dependency in the build environment) with the given interpreter, installs it with the test extras
# into a fresh virtualenv outside the source tree, checks it is the mypyc-compiled build, and runs
# the whole suite against it (the tests import the installed package, never src/).
#
#   scripts/test-wheel.sh PYTHON [CONSTRAINTS] [-- PYTEST ARGS...]
#
# CONSTRAINTS: a pip constraints file (e.g. scripts/oldest-deps.txt: the oldest supported versions of
# the optional dependencies) applied when installing the extras.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${1:?usage: scripts/test-wheel.sh PYTHON [CONSTRAINTS] [-- PYTEST ARGS]}
shift
constraints=()
if [ $# -gt 0 ] && [ "$1" != "--" ]; then constraints=(-c "$(realpath "$1")"); shift; fi
[ "${1:-}" = "--" ] && shift

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
work=${RATEWARDEN_TEST_DIR:-${TMPDIR:-/tmp}/ratewarden-test}/py$version
rm -rf "$work"
mkdir -p "$work/wheels"
echo "== Python $version ($python): fresh virtualenv in $work"
"$python" -m venv "$work/venv"
venv=$work/venv
"$venv/bin/python" -m pip install -q --upgrade pip

echo "== building the wheel (isolated build, as pip install does)"
RATEWARDEN_REQUIRE_COMPILED=1 "$venv/bin/python" -m pip wheel -q --no-deps -w "$work/wheels" "$root"
wheel=$(ls "$work"/wheels/ratewarden-*.whl)
front=$("$venv/bin/python" -c 'import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).read("ratewarden/_front_build.txt").decode().strip())' "$wheel" 2>/dev/null || echo "not attempted")
echo "   $(basename "$wheel"); compiled front door (ratewarden._front): $front"

echo "== installing it with the test extras${constraints:+ (constraints: ${constraints[1]})}"
"$venv/bin/python" -m pip install -q "${constraints[@]}" \
  "ratewarden[dev,fastapi,flask,django,sanic,redis,memcached,policy,metrics,serve,bench] @ file://$wheel"
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(redis|hiredis|aiomcache|fastapi|starlette|flask|werkzeug|django|sanic|prometheus.client|pyyaml) ' \
  | tr -s ' ' | tr '\n' ' '; echo

# Outside the source tree, the import must find the installed, compiled package.
(cd "$work" && "$venv/bin/ratewarden" --version && "$venv/bin/python" - <<'PY'
import ratewarden
assert ratewarden.COMPILED, f"the installed wheel is not compiled: {ratewarden.__file__}"
PY
)

echo "== the suite against the installed wheel"
PATH="$venv/bin:$PATH" RATEWARDEN_EXPECT_COMPILED=1 RATEWARDEN_EXPECT_INSTALLED=1 \
  "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
