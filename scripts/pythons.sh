#!/usr/bin/env bash
# Prints the CPython interpreters (3.10 or newer) found on this machine, one per minor version,
# oldest first: pyenv's versions, then python3.X on PATH. `make test` uses the first and the last,
# `make matrix` all of them.
set -uo pipefail
declare -A seen=()
candidates=()
root=${PYENV_ROOT:-$HOME/.pyenv}
for p in "$root"/versions/*/bin/python3 $(compgen -c python3. 2>/dev/null | sort -u); do
  candidates+=("$p")
done
for p in "${candidates[@]}"; do
  path=$(command -v "$p" 2>/dev/null) || continue
  v=$("$path" -c 'import sys; print("%d.%02d" % sys.version_info[:2]) if sys.version_info >= (3, 10) and sys.implementation.name == "cpython" else None' 2>/dev/null) || continue
  [ -n "$v" ] && [ "$v" != None ] || continue
  [ -n "${seen[$v]:-}" ] && continue
  seen[$v]=$path
done
for v in $(printf '%s\n' "${!seen[@]}" | sort); do echo "${seen[$v]}"; done
