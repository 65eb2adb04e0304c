#!/usr/bin/env bash
# One-shot set-up of a Debian 12 machine for skh: system packages (as root) and the project venv.
# Idempotent: installs only what is missing. Usage: tools/setup-debian.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
APT_PKGS=(
  build-essential python3-dev python3-venv pkg-config make git
  iproute2 nftables traceroute iputils-ping ethtool procps psmisc
  libibverbs-dev ibverbs-providers rdma-core ibverbs-utils python3-pyverbs linuxptp
  qemu-system-x86 busybox-static cpio kmod xz-utils systemd
  openvswitch-switch chromium
  libzmq3-dev libmsgpack-dev prometheus-alertmanager
  python3-torch
)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "skh setup: missing Debian packages: ${missing[*]}" >&2
    echo "skh setup: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  # Services from these packages (openvswitch, alertmanager) must not start on install: the
  # testbed and the tests run their own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  echo "skh setup: apt-get install ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The extension is built in the venv itself (no build isolation), so its build tools live there too.
"$VENV/bin/python" -m pip install -q "setuptools>=77" wheel "Cython>=3.0,<4" "numpy>=1.26"
"$VENV/bin/python" -m pip install -q --no-build-isolation -e '.[test,bench,ray]'
echo "skh setup: ready ($("$VENV/bin/python" -c 'import skh, sys; print(skh.__version__, sys.version.split()[0])'))"
