#!/usr/bin/env bash
# stage-skh.sh PY OUT: the skh wheel built from this tree (OUT/skh-*.whl) and installed from it,
# with its byte code, into OUT/site as a system Python's site directory would hold it. The
# systemd VM test (tests/deploy/test_systemd_vm.py) mounts OUT/site into the guest's
# /usr/local/lib/python3.X/dist-packages and runs the units against that installed package.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PYTHON OUTDIR" >&2; exit 2; }
PY=$1 OUT=$2
cd "$(dirname "$0")/../.."
rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" .
"$PY" -m pip install -q --no-deps --no-index --target "$OUT/site" "$OUT"/skh-*.whl
