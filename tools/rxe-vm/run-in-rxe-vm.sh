#!/usr/bin/env bash
# run-in-rxe-vm.sh CMD [ARGS...]   (skh's soft-RoCE test VM; `make test-verbs` uses it)
#
# Run CMD inside a throw-away qemu VM that boots a stock Debian kernel
# (linux-image-<abi>-amd64, which ships rdma_rxe) with two soft-RoCE devices:
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
RXEVM_MEM=${RXEVM_MEM:-2G}
RXEVM_SMP=${RXEVM_SMP:-2}
RXEVM_ACCEL=${RXEVM_ACCEL:-auto}
RXEVM_TIMEOUT=${RXEVM_TIMEOUT:-3000}
RXEVM_RW=${RXEVM_RW-}
RXEVM_SHARE_CWD=${RXEVM_SHARE_CWD:-1}
RXEVM_MTU=${RXEVM_MTU:-1500}
RXEVM_IPV4=${RXEVM_IPV4:-1}
RXEVM_VERBOSE=${RXEVM_VERBOSE:-0}
RXEVM_INSTALL=${RXEVM_INSTALL:-1}
IMAGE_VERSION=10   # bump when the image layout / stage-1 init changes

die() { echo "run-in-rxe-vm: $*" >&2; exit 125; }
note() { echo "run-in-rxe-vm: $*" >&2; }

[ $# -ge 1 ] || die "usage: $0 CMD [ARGS...]"
case "$RXEVM_CACHE" in /*) ;; *) die "RXEVM_CACHE must be an absolute path";; esac
case "$RXEVM_CACHE" in *[[:space:]]*) die "RXEVM_CACHE must not contain spaces";; esac

# ------------------------------------------------------------ host packages
is_static() { [ -x "$1" ] && ! ldd "$1" >/dev/null 2>&1; }
find_busybox() {
  BUSYBOX=
  for b in /bin/busybox /usr/bin/busybox; do is_static "$b" && { BUSYBOX=$b; return 0; }; done
  return 1
}
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
find_busybox || need_pkgs+=(busybox-static)
command -v cpio >/dev/null || need_pkgs+=(cpio)
command -v xz >/dev/null || need_pkgs+=(xz-utils)
command -v depmod >/dev/null || need_pkgs+=(kmod)
command -v rdma >/dev/null || need_pkgs+=(iproute2)
command -v ibv_devinfo >/dev/null || need_pkgs+=(ibverbs-utils)
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 \
  || need_pkgs+=(ibverbs-providers rdma-core)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  [ "$RXEVM_INSTALL" = 1 ] && [ "$(id -u)" = 0 ] || die "missing host packages: ${need_pkgs[*]}"
  note "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need_pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null 2>&1; apt-get install -y --no-install-recommends "${need_pkgs[@]}" >/dev/null; } \
    || die "apt-get install ${need_pkgs[*]} failed"
  find_busybox || true
fi
[ -n "$BUSYBOX" ] || die "no static busybox (install busybox-static)"

mkdir -p "$RXEVM_CACHE"

# ------------------------------------------------- kernel + initramfs (cached)
# Modules loaded by the stage-1 init straight from the initramfs (+ their deps)
INITRD_MODS="virtio_pci 9pnet_virtio 9p overlay crc32_generic veth rdma_rxe ib_uverbs rdma_ucm"

build_image() {   # $1 = KVER; fills $RXEVM_CACHE/k-$KVER (idempotent)
  local kver=$1 kd="$RXEVM_CACHE/k-$1" tmp off
  if [ ! -f "$kd/.kernel-ok" ]; then
    note "fetching linux-image-$kver (once)"
    tmp=$(mktemp -d "$RXEVM_CACHE/dl.XXXXXX")
    dl() { ( cd "$tmp" && apt-get download -o APT::Sandbox::User=root "linux-image-$kver" ) >/dev/null 2>&1; }
    dl || { apt-get update >/dev/null 2>&1; dl; } || { rm -rf "$tmp"; die "apt-get download linux-image-$kver failed"; }
    rm -rf "$kd"; mkdir -p "$kd/x" "$kd/lib/modules"
    dpkg-deb -x "$tmp"/linux-image-"$kver"_*.deb "$kd/x"
    rm -rf "$tmp"
    mv "$kd/x/boot/vmlinuz-$kver" "$kd/vmlinuz"
    if [ -d "$kd/x/lib/modules/$kver" ]; then mv "$kd/x/lib/modules/$kver" "$kd/lib/modules/"
    else mv "$kd/x/usr/lib/modules/$kver" "$kd/lib/modules/"; fi   # merged-/usr packages
    rm -rf "$kd/x"
    [ -f "$kd/lib/modules/$kver/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] \
      || die "linux-image-$kver has no rdma_rxe.ko (cloud flavour?); use the generic -amd64 one"
    # drop big trees a VM never needs (cache ~200 MB instead of ~400 MB)
    ( cd "$kd/lib/modules/$kver/kernel" && rm -rf drivers/gpu drivers/media sound drivers/staging \
        net/wireless drivers/net/wireless drivers/bluetooth net/bluetooth drivers/iio drivers/usb )
    depmod -b "$kd" "$kver"
    # Uncompressed ELF vmlinux: qemu boots it through the PVH entry point,
    # skipping the real-mode setup and the XZ decompression, which under TCG
    # costs ~3.5 s per boot.  Falls back to the bzImage if this fails.
    off=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$kd/vmlinuz" | head -n1 | cut -d: -f1 || true)
    # (xz stops after the first stream; process substitution, not a pipe, so
    # tail's SIGPIPE on the trailing bytes does not trip pipefail)
    if [ -n "$off" ] && xz -dc --single-stream < <(tail -c +$((off + 1)) "$kd/vmlinuz") > "$kd/vmlinux.tmp" 2>/dev/null \
       && [ "$(head -c4 "$kd/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      mv "$kd/vmlinux.tmp" "$kd/vmlinux"
    else
      rm -f "$kd/vmlinux.tmp"; note "could not extract vmlinux; booting the bzImage (slower)"
    fi
    touch "$kd/.kernel-ok"
  fi
  if [ ! -f "$kd/initrd.cpio" ] || [ "$(cat "$kd/.image-version" 2>/dev/null)" != "$IMAGE_VERSION" ]; then
    note "building initramfs for $kver"
    local ir="$kd/initrd.d" m p b
    rm -rf "$ir"; mkdir -p "$ir"/{bin,dev,proc,sys,lower,ovl,newroot,mods}
    cp "$BUSYBOX" "$ir/bin/busybox"
    for a in sh mount umount mkdir insmod switch_root cat echo sleep poweroff ln stty; do
      ln -s busybox "$ir/bin/$a"; done
    : > "$ir/mods/order"
    for m in $INITRD_MODS; do
      while read -r _ p _; do
        case "$p" in /*.ko) ;; *) continue;; esac
        b=$(basename "$p")
        grep -qx "$b" "$ir/mods/order" || { cp "$p" "$ir/mods/$b"; echo "$b" >> "$ir/mods/order"; }
      done < <(modprobe -d "$kd" -S "$kver" --show-depends "$m")
    done
    cat > "$ir/init" <<'EOF_INIT'
#!/bin/sh
# rxevm stage 1 (busybox, PID 1): load modules, mount the host root (9p, ro)
# under a tmpfs overlay plus the read-write shares, switch_root into it.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
up() { read -r u _ < /proc/uptime; echo "rxevm-init: $* ${u}s"; }
fail() { echo "rxevm-init: FATAL: $*"; cat /proc/mounts; echo o > /proc/sysrq-trigger; sleep 5; poweroff -f; }
up start
for w in $(cat /proc/cmdline); do
  case "$w" in rxevm.run=*) RUN=${w#rxevm.run=};; rxevm.kver=*) KVER=${w#rxevm.kver=};;
               rxevm.cache=*) CACHE=${w#rxevm.cache=};; esac
done
[ -n "$RUN" ] && [ -n "$KVER" ] && [ -n "$CACHE" ] || fail "rxevm.run/kver/cache missing on the command line"
while read -r m; do insmod "/mods/$m" || fail "insmod $m"; done < /mods/order
echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
echo rxevm > /proc/sys/kernel/hostname
up "modules loaded"
o9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$o9,ro,cache=loose" hostroot /lower || fail "mount 9p hostroot"
mount -t tmpfs -o mode=755 tmpfs /ovl
mkdir -p /ovl/u /ovl/w
mount -t overlay -o lowerdir=/lower,upperdir=/ovl/u,workdir=/ovl/w overlay /newroot || fail "overlay mount"
# per-run dir and read-write shares, at the same path as on the host
# (a 9p channel can be mounted only once, so mount each directly in place)
mkdir -p "/newroot$RUN"
mount -t 9p -o "$o9,cache=mmap" rxevmrun "/newroot$RUN" || fail "mount run dir"
while read -r tag path; do
  mkdir -p "/newroot$path" && mount -t 9p -o "$o9,cache=mmap" "$tag" "/newroot$path" || fail "mount $tag on $path"
done < "/newroot$RUN/shares"
# this kernel's modules, where modprobe looks for them
mkdir -p "/newroot/lib/modules/$KVER"
mount -o bind "/newroot$CACHE/k-$KVER/lib/modules/$KVER" "/newroot/lib/modules/$KVER" || fail "bind modules"
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mount -o move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
ln -sfn /proc/self/fd /newroot/dev/fd
ln -sfn fd/0 /newroot/dev/stdin; ln -sfn fd/1 /newroot/dev/stdout; ln -sfn fd/2 /newroot/dev/stderr
stty -F /newroot/dev/ttyS1 raw -echo
up "switch_root"
mount -o move /sys /newroot/sys
mount -o move /proc /newroot/proc
exec switch_root /newroot /bin/bash "$RUN/stage2.sh" "$RUN"
EOF_INIT
    chmod +x "$ir/init"
    mknod -m 600 "$ir/dev/console" c 5 1
    ( cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet ) > "$kd/initrd.cpio.tmp"
    mv "$kd/initrd.cpio.tmp" "$kd/initrd.cpio"
    rm -rf "$ir"
    echo "$IMAGE_VERSION" > "$kd/.image-version"
  fi
}

exec 9>"$RXEVM_CACHE/.lock"
flock 9
KVER=${RXEVM_KVER:-}
if [ -z "$KVER" ]; then   # prefer a cached kernel: no network, stable in CI
  for d in "$RXEVM_CACHE"/k-*/; do
    [ -f "$d/.kernel-ok" ] && { KVER=$(basename "$d"); KVER=${KVER#k-}; }
  done
fi
if [ -z "$KVER" ]; then
  # nothing cached: refresh the index first, since Debian drops old kernel
  # ABIs from the mirror when a new one lands
  note "resolving the current linux-image-amd64 (apt-get update)"
  apt-get update >/dev/null 2>&1 || note "apt-get update failed; using the current index"
  KVER=$(apt-cache depends linux-image-amd64 2>/dev/null \
           | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -n1)
  [ -n "$KVER" ] || die "cannot resolve linux-image-amd64; set RXEVM_KVER"
fi
build_image "$KVER"
flock -u 9
exec 9>&-
KD="$RXEVM_CACHE/k-$KVER"

# ------------------------------------------------------------------ per run
RUN=$(mktemp -d "$RXEVM_CACHE/run.XXXXXX")
QPID=
cleanup() {
  if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then kill "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true; fi
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

CWD=$(pwd -P)
virtfs=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$RUN,mount_tag=rxevmrun,security_model=none")
: > "$RUN/shares"
n=0
add_rw() {
  local d
  d=$(cd "$1" 2>/dev/null && pwd -P) || die "RXEVM_RW: no such directory: $1"
  case "$d" in /|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*|"$RXEVM_CACHE"|"$RXEVM_CACHE"/*)
    note "not sharing $d read-write (it stays read-only)"; return;; esac
  case "$d" in *[[:space:],]*) note "cannot share '$d' read-write (space/comma in path)"; return;; esac
  virtfs+=(-virtfs "local,path=$d,mount_tag=rw$n,security_model=none")
  echo "rw$n $d" >> "$RUN/shares"; n=$((n + 1))
}
if [ "$RXEVM_SHARE_CWD" = 1 ]; then add_rw "$CWD"; fi
IFS=: read -r -a extra <<< "$RXEVM_RW" || true
for d in "${extra[@]}"; do if [ -n "$d" ]; then add_rw "$d"; fi; done
# mount parents before children
awk '{ print length($2), $0 }' "$RUN/shares" | sort -n | cut -d' ' -f2- > "$RUN/shares.sorted"
mv "$RUN/shares.sorted" "$RUN/shares"

# CMD's environment: everything exported here, minus shell/session internals
{
  declare -px | grep -Ev '^declare -[a-zA-Z]*r|^declare -x (PWD|OLDPWD|SHLVL|_|BASHOPTS|SHELLOPTS|BASH_[A-Z_]*|HOSTNAME|TERMCAP|COLUMNS|LINES|DBUS_[A-Z_]*|XDG_RUNTIME_DIR|SSH_AUTH_SOCK)=' || true
  echo 'export RXEVM=1'
  printf 'RXEVM_CWD=%q\n' "$CWD"
  printf 'RXEVM_ARGV=('; printf '%q ' "$@"; printf ')\n'
} > "$RUN/env"
printf 'MTU=%q\nIPV4=%q\n' "$RXEVM_MTU" "$RXEVM_IPV4" > "$RUN/conf"

cat > "$RUN/stage2.sh" <<'EOF_STAGE2'
#!/bin/bash
# rxevm stage 2 (host userland, PID 1): bring up rxe0/rxe1, run CMD, power off
RUN=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
exec </dev/null >/dev/console 2>&1
up() { local u; read -r u _ < /proc/uptime; echo "rxevm: $* (${u}s)"; }
finish() {
  echo "$1" > "$RUN/rc.tmp" && mv "$RUN/rc.tmp" "$RUN/rc"
  sync
  echo o > /proc/sysrq-trigger; sleep 10
}
. "$RUN/conf"
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
up "stage2"
if ! setup; then echo "rxevm: rxe setup failed"; dmesg | tail -n 40; finish 125; fi
up "rxe0/rxe1 up"
. "$RUN/env"
cd "$RXEVM_CWD" || { echo "rxevm: cannot cd to $RXEVM_CWD"; finish 125; }
# CMD's stdout+stderr go to a file on tmpfs (so CMD sees a plain file, as
# in CI, not a tty), which `tail -f` streams to the 2nd serial port, which qemu
# streams to our stdout.  CMD runs in the foreground (normal signal
# dispositions); once it exits, tail drains the file and stops, so leftover
# background processes of CMD cannot hold the run open.
out=/run/rxevm-cmd.out
: > "$out"
exec 3>/dev/ttyS1
sleep infinity & marker=$!
tail -c +1 -s 0.1 -f --pid="$marker" "$out" >&3 2>/dev/null & tailpid=$!
"${RXEVM_ARGV[@]}" >>"$out" 2>&1 3>&-
rc=$?
kill "$marker" 2>/dev/null
for i in $(seq 1 300); do kill -0 "$tailpid" 2>/dev/null || break; sleep 0.1; done
kill "$tailpid" 2>/dev/null
exec 3>&-   # the last close of the tty waits until its output has drained
up "command exited with $rc"
dmesg > "$RUN/dmesg" 2>/dev/null
finish "$rc"
EOF_STAGE2

# --------------------------------------------------------------------- boot
accel=$RXEVM_ACCEL
if [ "$accel" = auto ]; then
  accel=tcg
  if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
fi
case "$accel" in
  kvm) acc=(-accel kvm -cpu host) ;;
  tcg) acc=(-accel tcg,thread=multi -cpu max) ;;
  *) die "RXEVM_ACCEL must be auto, kvm or tcg" ;;
esac
kernel="$KD/vmlinux"; [ -f "$kernel" ] || kernel="$KD/vmlinuz"

# serial0 = guest console -> $RUN/console.log; serial1 = CMD's output -> stdout
# (a serial port, unlike virtio-console, keeps writing when qemu's stdin is
# /dev/null, as it is in CI)
# no_timer_check: on a starved host (load 10+ on 2 cores) TCG runs the guest so
# slowly that the kernel's IO-APIC timer check fails and it panics at boot
# ("IO-APIC + timer doesn't work"); the check has no use in a VM
timeout -k 10 "$RXEVM_TIMEOUT" qemu-system-x86_64 \
  -nodefaults -no-user-config -display none -no-reboot \
  "${acc[@]}" -smp "$RXEVM_SMP" -m "$RXEVM_MEM" \
  -kernel "$kernel" -initrd "$KD/initrd.cpio" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable no_timer_check nokaslr rxevm.run=$RUN rxevm.kver=$KVER rxevm.cache=$RXEVM_CACHE ${RXEVM_APPEND:-}" \
  -serial "file:$RUN/console.log" \
  -chardev stdio,id=out,signal=off -serial chardev:out \
  -device virtio-rng-pci \
  "${virtfs[@]}" < /dev/null &
QPID=$!
set +e
wait "$QPID"; qrc=$?
set -e
QPID=

if [ -f "$RUN/rc" ]; then
  rc=$(cat "$RUN/rc")
  if [ "$RXEVM_VERBOSE" = 1 ] || [ "$rc" = 125 ]; then
    note "---- guest console ----"; cat "$RUN/console.log" >&2 || true
  fi
  exit "$rc"
fi
note "VM ended without a result (qemu/timeout rc=$qrc)"
note "---- guest console (tail) ----"; tail -n 60 "$RUN/console.log" >&2 || true
[ "$qrc" = 124 ] && exit 124
exit 125
