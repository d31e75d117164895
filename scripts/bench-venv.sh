#!/usr/bin/env bash
# Builds what a bench target runs, and only that: the compiled wheel, built the way pip builds it
# (isolated build: pip fetches setuptools and mypy for it), installed with the bench extras in a
# virtualenv of its own. Says what each step does, how long the slow ones usually take, and how
# long each took, each line headed by the target it builds for (BENCH_TARGET: `make bench`, or
# `make bench-gateway` for the wheel with the compiled front door). Needs a C compiler and the
# Python headers (scripts/install-system-deps.sh).
#
#   [BENCH_TARGET="make bench-gateway"] scripts/bench-venv.sh [VENV]    (default build/venv-wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/venv-wheel}
wheels=build/wheels
python=${PYTHON:-python3}
target=${BENCH_TARGET:-make bench}
start=$SECONDS

step() { echo "== $target [$((SECONDS - start)) s]: $*"; }

# Runs a quiet command, printing a line every 20 s so a slow step is not mistaken for a hang.
quietly() {
  "$@" &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 20)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then echo "   ... still working (${waited} s)"; fi
  done
  wait "$pid"
}

rm -rf "$venv" "$wheels"
step "a virtualenv for the compiled wheel in $venv ($("$python" --version))"
"$python" -m venv "$venv"  # with the pip it bundles: enough for what follows, and no download
if [ -n "${RATEWARDEN_NO_FRONT:-}" ]; then
  step "compiling the wheel with mypyc (about 1.5 min on 2 cores, more on a busy machine)"
else
  step "compiling the wheel with mypyc, and the front door with cargo when present (about 1-2 min on 2 cores, 4-5 for cargo's first build, more on a busy machine)"
fi
# The extras' own dependencies do not need the wheel: they install while it compiles (the C compiler
# keeps the cores busy; the install mostly waits on downloads), and the wheel goes on top of them.
deps=$("$venv/bin/python" - <<'PY' 2>/dev/null || true
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print("\n".join(sorted({r for name in ("bench", "serve", "redis") for r in extras[name]})))
PY
)
if [ -n "$deps" ]; then
  printf '%s\n' "$deps" > "$venv/extras-deps.txt"
  "$venv/bin/python" -m pip install -q -r "$venv/extras-deps.txt" > "$venv/extras-deps.log" 2>&1 &
  deps_pid=$!
fi
quietly env RATEWARDEN_REQUIRE_COMPILED=1 "$venv/bin/python" -m pip wheel -q --no-deps -w "$wheels" .
if [ -n "${deps_pid:-}" ] && ! wait "$deps_pid"; then
  step "the extras' dependencies did not install ahead (pip said: $(tail -1 "$venv/extras-deps.log")); they install with the wheel"
fi
wheel=$(ls "$PWD/$wheels"/ratewarden-*.whl)
front=$("$venv/bin/python" -c 'import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).read("ratewarden/_front_build.txt").decode().strip())' "$wheel" 2>/dev/null || echo "not attempted")
step "compiled front door (ratewarden._front): $front"
step "installing $(basename "$wheel") with the bench, serve and redis extras (FastAPI, uvicorn, traffik, slowapi, limits, ...; about 30 s)"
quietly "$venv/bin/python" -m pip install -q "ratewarden[bench,serve,redis] @ file://$wheel"
step "ready: $("$venv/bin/ratewarden" --version)"
