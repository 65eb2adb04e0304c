#!/usr/bin/env bash
# run-in-rxe-vm.sh CMD [ARGS...]   (skh's soft-RoCE test VM; `make test-verbs` uses it)
#
# Run CMD inside a throw-away qemu VM (tools/vm/common.sh) that boots a stock
# Debian kernel (linux-image-<abi>-amd64, which ships rdma_rxe) with two
# soft-RoCE devices:
#
#     rxe0 on rxev0 (02:00:00:00:00:01)  <-- veth -->  rxe1 on rxev1 (..:02)
#
# The guest's root filesystem is the HOST's root, shared read-only over 9p
# with a tmpfs overlay on top (everything looks writable; writes are thrown
# away).  The current directory (and any RXEVM_RW dirs) are shared read-write
# at the same path, so build outputs and test reports persist.  CMD runs as
# root, with the caller's exported environment, in the caller's cwd; its
# stdout+stderr are streamed to our stdout; we exit with CMD's exit status.
#
# Host needs only Debian packages (installed on demand when run as root):
#   qemu-system-x86 busybox-static cpio kmod xz-utils iproute2 rdma-core
#   ibverbs-utils ibverbs-providers  (+ the kernel .deb, via apt-get download)
#
# Knobs (environment):
#   RXEVM_CACHE    cache dir for kernel + initramfs   (default $TMPDIR/skh-rxevm/cache)
#   RXEVM_KVER     kernel ABI, e.g. 6.1.0-57-amd64 (default: the one already
#                  cached, else whatever linux-image-amd64 currently depends on)
#   RXEVM_MEM      guest RAM (default 2G)        RXEVM_SMP  vCPUs (default 2)
#   RXEVM_ACCEL    auto|kvm|tcg (auto: kvm only if /dev/kvm and vmx/svm flags)
#   RXEVM_TIMEOUT  seconds before the VM is killed (default 3000)
#   RXEVM_RW       extra host dirs to share read-write, ':'-separated
#   RXEVM_SHARE_CWD=0  do not share $PWD read-write (default 1)
#   RXEVM_MTU      veth MTU (default 1500 -> rxe active_mtu 1024)
#   RXEVM_IPV4=0   no IPv4: by default rxev0/rxev1 get 192.0.2.1/24 and
#                  192.0.2.2/24 (TEST-NET-1, exists only inside the VM, which
#                  has no NIC), giving a RoCEv2 IPv4-mapped GID at index 1,
#                  with policy routing so rxe0 <-> rxe1 traffic uses the veth
#   RXEVM_VERBOSE=1  print the guest console log after the run
#   RXEVM_APPEND   extra kernel command line (e.g. loglevel=7)
#   RXEVM_INSTALL=0  never apt-get install missing host packages
#
# Exit status: CMD's; 124 if the VM timed out; 125 on VM/setup failure.
#
# In the guest: rxe0/rxe1, port 1.  rxe is RoCE v2 only:
#   GID index 0 = fe80::ff:fe00:1 (rxe0) / fe80::ff:fe00:2 (rxe1)
#   GID index 1 = ::ffff:192.0.2.1 (rxe0) / ::ffff:192.0.2.2 (rxe1)
# RXEVM=1 is set in CMD's environment.
set -euo pipefail

RXEVM_CACHE=${RXEVM_CACHE:-${TMPDIR:-/tmp}/skh-rxevm/cache}
RXEVM_TIMEOUT=${RXEVM_TIMEOUT:-3000}
RXEVM_MTU=${RXEVM_MTU:-1500}
RXEVM_IPV4=${RXEVM_IPV4:-1}
VM_NAME=run-in-rxe-vm VM_PREFIX=RXEVM VM_ACCEL=${RXEVM_ACCEL:-auto}
# shellcheck source=tools/vm/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../vm/common.sh"
vm_init "$@"

extra_pkgs=()
command -v rdma >/dev/null || extra_pkgs+=(iproute2)
command -v ibv_devinfo >/dev/null || extra_pkgs+=(ibverbs-utils)
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 \
  || extra_pkgs+=(ibverbs-providers rdma-core)
vm_host_packages "${extra_pkgs[@]}"

# The whole module tree (tests may modprobe more), less the big trees a VM never needs.
# shellcheck disable=SC2317  # called by vm_image
rxe_kernel() {   # KVER KD
  local kver=$1 kd=$2
  vm_fetch_kernel "$kver" "$kd"
  [ -f "$kd/lib/modules/$kver/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] \
    || vm_die "linux-image-$kver has no rdma_rxe.ko (cloud flavour?); use the generic -amd64 one"
  # (cache ~200 MB instead of ~400 MB)
  ( cd "$kd/lib/modules/$kver/kernel" && rm -rf drivers/gpu drivers/media sound drivers/staging \
      net/wireless drivers/net/wireless drivers/bluetooth net/bluetooth drivers/iio drivers/usb )
  depmod -b "$kd" "$kver"
}
# loaded by the stage-1 init straight from the initramfs (+ their dependencies)
vm_image rxe_kernel "virtio_pci 9pnet_virtio 9p overlay crc32_generic veth rdma_rxe ib_uverbs rdma_ucm"

vm_run_dir "$@"
printf 'MTU=%q\nIPV4=%q\n' "$RXEVM_MTU" "$RXEVM_IPV4" >> "$RUN/conf"
cat > "$RUN/stage2.sh" <<'EOF_STAGE2'
#!/bin/bash
# rxevm stage 2 (host userland, PID 1): bring up rxe0/rxe1, run CMD, power off
RUN=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
exec </dev/null >/dev/console 2>&1
. "$RUN/guest.sh"
vm_up "stage2"
# what an init system would set up (no DAD: the GIDs must be usable at once)
echo rxevm > /proc/sys/kernel/hostname
echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
ln -sfn /proc/self/fd /dev/fd
ln -sfn fd/0 /dev/stdin; ln -sfn fd/1 /dev/stdout; ln -sfn fd/2 /dev/stderr
setup() {
  local v4= i s0 s1 k
  if [ "$IPV4" = 1 ]; then
    # Both addresses are local to this one namespace, so by default the
    # kernel would route rxev0 -> 192.0.2.2 through lo (rxe drops that:
    # "Failed to create AH").  Send locally generated traffic for the peer
    # address out of the veth instead (policy routing ahead of the local
    # table), and accept packets whose source address is local.
    for k in all default; do
      echo 1 > /proc/sys/net/ipv4/conf/$k/accept_local; echo 0 > /proc/sys/net/ipv4/conf/$k/rp_filter
    done
    v4='addr add 192.0.2.1/24 dev rxev0
addr add 192.0.2.2/24 dev rxev1
rule add pref 100 iif lo to 192.0.2.2 lookup 100
route add 192.0.2.2 dev rxev0 src 192.0.2.1 table 100
rule add pref 101 iif lo to 192.0.2.1 lookup 101
route add 192.0.2.1 dev rxev1 src 192.0.2.2 table 101
rule add pref 1000 lookup local
rule del pref 0'
  fi
  ip -batch - <<EOF || return 1
link set lo up
link add rxev0 address 02:00:00:00:00:01 mtu $MTU type veth peer name rxev1 address 02:00:00:00:00:02 mtu $MTU
link set rxev0 up
link set rxev1 up
$v4
EOF
  if [ "$IPV4" = 1 ]; then
    for k in rxev0 rxev1; do
      echo 1 > /proc/sys/net/ipv4/conf/$k/accept_local; echo 0 > /proc/sys/net/ipv4/conf/$k/rp_filter
    done
  fi
  rdma -b - <<EOF || return 1
link add rxe0 type rxe netdev rxev0
link add rxe1 type rxe netdev rxev1
EOF
  for i in $(seq 1 200); do
    read -r _ s0 < /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null
    read -r _ s1 < /sys/class/infiniband/rxe1/ports/1/state 2>/dev/null
    [ "$s0" = ACTIVE ] && [ "$s1" = ACTIVE ] && [ -e /dev/infiniband/uverbs1 ] && return 0
    sleep 0.05
  done
  echo "rxevm: rxe ports did not become ACTIVE"; return 1
}
if ! setup; then echo "rxevm: rxe setup failed"; dmesg | tail -n 40; vm_finish 125; fi
vm_up "rxe0/rxe1 up"
. "$RUN/env"
vm_run_cmd
EOF_STAGE2

vm_boot "${RXEVM_APPEND:-}"
vm_exit
