#!/usr/bin/env bash
# run-in-systemd-vm.sh CMD [ARGS...]   (skh's systemd test VM; `make test-systemd` uses it)
#
# Run CMD inside a throw-away qemu VM whose PID 1 is the host's own systemd, booted on a stock
# Debian kernel (linux-image-<abi>-amd64).  The approach is tools/rxe-vm's: the guest's root
# filesystem is the HOST's root, shared read-only over 9p with a tmpfs overlay on top (writes
# are thrown away), and the current directory is shared read-write unless SYSVM_SHARE_CWD=0.
#
# The guest boots `skh-vm.target` (basic.target plus one service that runs CMD as root with
# the caller's exported environment, in the caller's cwd), so CMD sees a real, fully started
# service manager: `systemctl start`, Type=notify, WatchdogSec=, DynamicUser=,
# LoadCredential=, NetworkNamespacePath= all behave as on a host.  CMD's stdout+stderr are
# streamed to our stdout; we exit with CMD's exit status.
#
# Host needs only Debian packages (installed on demand when run as root):
#   qemu-system-x86 busybox-static cpio kmod xz-utils systemd  (+ the kernel .deb)
#
# Knobs (environment):
#   SYSVM_CACHE    cache dir for kernel + initramfs    (default $TMPDIR/skh-systemdvm/cache)
#   SYSVM_KVER     kernel ABI, e.g. 6.1.0-57-amd64 (default: the one already cached, else the
#                  one tools/rxe-vm cached, else whatever linux-image-amd64 depends on now)
#   SYSVM_MEM      guest RAM (default 2G)        SYSVM_SMP  vCPUs (default 2)
#   SYSVM_TIMEOUT  seconds before the VM is killed (default 1200)
#   SYSVM_RW       extra host dirs to share read-write, ':'-separated
#   SYSVM_SHARE_CWD=0  do not share $PWD read-write (it stays visible read-only)
#   SYSVM_JOURNAL  write the guest's journal (journalctl -b) to this host file
#   SYSVM_VERBOSE=1  print the guest console log after the run
#   SYSVM_INSTALL=0  never apt-get install missing host packages
#
# Exit status: CMD's; 124 if the VM timed out; 125 on VM/boot failure.
# SYSVM=1 is set in CMD's environment.
set -euo pipefail

SYSVM_CACHE=${SYSVM_CACHE:-${TMPDIR:-/tmp}/skh-systemdvm/cache}
SYSVM_MEM=${SYSVM_MEM:-2G}
SYSVM_SMP=${SYSVM_SMP:-2}
SYSVM_TIMEOUT=${SYSVM_TIMEOUT:-1200}
SYSVM_RW=${SYSVM_RW-}
SYSVM_SHARE_CWD=${SYSVM_SHARE_CWD:-1}
SYSVM_JOURNAL=${SYSVM_JOURNAL-}
SYSVM_VERBOSE=${SYSVM_VERBOSE:-0}
SYSVM_INSTALL=${SYSVM_INSTALL:-1}
RXEVM_CACHE=${RXEVM_CACHE:-${TMPDIR:-/tmp}/skh-rxevm/cache}
IMAGE_VERSION=2   # bump when the image layout / stage-1 init changes

die() { echo "run-in-systemd-vm: $*" >&2; exit 125; }
note() { echo "run-in-systemd-vm: $*" >&2; }

[ $# -ge 1 ] || die "usage: $0 CMD [ARGS...]"
case "$SYSVM_CACHE" in /*) ;; *) die "SYSVM_CACHE must be an absolute path";; esac
case "$SYSVM_CACHE" in *[[:space:]]*) die "SYSVM_CACHE must not contain spaces";; esac

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
[ -x /lib/systemd/systemd ] || need_pkgs+=(systemd)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  [ "$SYSVM_INSTALL" = 1 ] && [ "$(id -u)" = 0 ] || die "missing host packages: ${need_pkgs[*]}"
  note "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need_pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null 2>&1; apt-get install -y --no-install-recommends "${need_pkgs[@]}" >/dev/null; } \
    || die "apt-get install ${need_pkgs[*]} failed"
  find_busybox || true
fi
[ -n "$BUSYBOX" ] || die "no static busybox (install busybox-static)"

mkdir -p "$SYSVM_CACHE"

# ------------------------------------------------- kernel + initramfs (cached)
# Loaded by the stage-1 init from the initramfs (with their dependencies): the 9p root.
INITRD_MODS="virtio_pci 9pnet_virtio 9p overlay"
# Kept in the guest's /lib/modules for modprobe: veth and dummy for test namespaces, the rest
# for what systemd itself loads at boot (autofs4 for binfmt_misc, configfs, fuse, loop).
GUEST_MODS="$INITRD_MODS veth dummy autofs4 configfs fuse loop"

# The kernel image and its module tree: from tools/rxe-vm's cache when it holds this ABI (CI
# runs that VM first), else downloaded with apt.  Only vmlinux and the modules above are kept.
fetch_kernel() {   # $1 = KVER, $2 = target dir; leaves $2/vmlinuz (+ vmlinux); sets SRC to a
                   # directory holding lib/modules/KVER (read only from here on)
  local kver=$1 kd=$2 rx="$RXEVM_CACHE/k-$1" tmp
  if [ -f "$rx/.kernel-ok" ] && [ -f "$rx/lib/modules/$kver/modules.dep" ]; then
    note "using the kernel cached by tools/rxe-vm ($kver)"
    cp "$rx/vmlinuz" "$kd/vmlinuz"
    if [ -f "$rx/vmlinux" ]; then cp "$rx/vmlinux" "$kd/vmlinux"; fi
    SRC=$rx
    return 0
  fi
  note "fetching linux-image-$kver (once)"
  tmp=$(mktemp -d "$SYSVM_CACHE/dl.XXXXXX")
  dl() { ( cd "$tmp" && apt-get download -o APT::Sandbox::User=root "linux-image-$kver" ) >/dev/null 2>&1; }
  dl || { apt-get update >/dev/null 2>&1; dl; } || { rm -rf "$tmp"; die "apt-get download linux-image-$kver failed"; }
  mkdir -p "$kd/x"
  dpkg-deb -x "$tmp"/linux-image-"$kver"_*.deb "$kd/x"
  rm -rf "$tmp"
  mv "$kd/x/boot/vmlinuz-$kver" "$kd/vmlinuz"
  mkdir -p "$kd/src/lib/modules"
  if [ -d "$kd/x/lib/modules/$kver" ]; then mv "$kd/x/lib/modules/$kver" "$kd/src/lib/modules/"
  else mv "$kd/x/usr/lib/modules/$kver" "$kd/src/lib/modules/"; fi   # merged-/usr packages
  rm -rf "$kd/x"
  depmod -b "$kd/src" "$kver"
  SRC=$kd/src
}

build_image() {   # $1 = KVER; fills $SYSVM_CACHE/k-$KVER (idempotent)
  local kver=$1 kd="$SYSVM_CACHE/k-$1" off m p b rel f SRC
  if [ ! -f "$kd/.kernel-ok" ]; then
    rm -rf "$kd"; mkdir -p "$kd"
    fetch_kernel "$kver" "$kd"
    [ -f "$SRC/lib/modules/$kver/kernel/fs/9p/9p.ko" ] \
      || die "linux-image-$kver has no 9p.ko (cloud flavour?); use the generic -amd64 one"
    # the modules the guest needs, with their dependencies, in a tree of their own
    mkdir -p "$kd/lib/modules/$kver"
    for f in modules.builtin modules.builtin.modinfo modules.order; do
      if [ -f "$SRC/lib/modules/$kver/$f" ]; then cp "$SRC/lib/modules/$kver/$f" "$kd/lib/modules/$kver/"; fi
    done
    for m in $GUEST_MODS; do
      while read -r _ p _; do
        case "$p" in /*.ko) ;; *) continue;; esac
        rel=${p#*/lib/modules/$kver/}
        mkdir -p "$kd/lib/modules/$kver/$(dirname "$rel")"
        cp "$p" "$kd/lib/modules/$kver/$rel"
      done < <(modprobe -d "$SRC" -S "$kver" --show-depends "$m")
    done
    depmod -b "$kd" "$kver"
    # Uncompressed ELF vmlinux: qemu boots it through the PVH entry point, skipping the
    # real-mode setup and the XZ decompression (~3.5 s per boot under TCG); bzImage fallback.
    if [ ! -f "$kd/vmlinux" ]; then
      off=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$kd/vmlinuz" | head -n1 | cut -d: -f1 || true)
      if [ -n "$off" ] && xz -dc --single-stream < <(tail -c +$((off + 1)) "$kd/vmlinuz") > "$kd/vmlinux.tmp" 2>/dev/null \
         && [ "$(head -c4 "$kd/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
        mv "$kd/vmlinux.tmp" "$kd/vmlinux"
      else
        rm -f "$kd/vmlinux.tmp"; note "could not extract vmlinux; booting the bzImage (slower)"
      fi
    fi
    rm -rf "$kd/src"
    touch "$kd/.kernel-ok"
  fi
  if [ ! -f "$kd/initrd.cpio" ] || [ "$(cat "$kd/.image-version" 2>/dev/null)" != "$IMAGE_VERSION" ]; then
    note "building initramfs for $kver"
    local ir="$kd/initrd.d"
    rm -rf "$ir"; mkdir -p "$ir"/{bin,dev,proc,sys,lower,ovl,newroot,mods}
    cp "$BUSYBOX" "$ir/bin/busybox"
    for a in sh mount mkdir insmod switch_root cat echo sleep poweroff; do ln -s busybox "$ir/bin/$a"; done
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
# systemd-vm stage 1 (busybox, PID 1): mount the host root (9p, ro) under a tmpfs overlay plus
# the read-write shares, then switch_root into it and run the per-run boot script, which execs
# systemd.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "sysvm-init: FATAL: $*"; cat /proc/mounts; echo o > /proc/sysrq-trigger; sleep 5; poweroff -f; }
for w in $(cat /proc/cmdline); do
  case "$w" in sysvm.run=*) RUN=${w#sysvm.run=};; sysvm.kver=*) KVER=${w#sysvm.kver=};;
               sysvm.cache=*) CACHE=${w#sysvm.cache=};; esac
done
[ -n "$RUN" ] && [ -n "$KVER" ] && [ -n "$CACHE" ] || fail "sysvm.run/kver/cache missing on the command line"
while read -r m; do insmod "/mods/$m" || fail "insmod $m"; done < /mods/order
o9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$o9,ro,cache=loose" hostroot /lower || fail "mount 9p hostroot"
mount -t tmpfs -o mode=755 tmpfs /ovl
mkdir -p /ovl/u /ovl/w
mount -t overlay -o lowerdir=/lower,upperdir=/ovl/u,workdir=/ovl/w overlay /newroot || fail "overlay mount"
# per-run dir and read-write shares at their host paths (a 9p tag can be mounted only once)
mkdir -p "/newroot$RUN"
mount -t 9p -o "$o9,cache=mmap" sysvmrun "/newroot$RUN" || fail "mount run dir"
while read -r tag path; do
  mkdir -p "/newroot$path" && mount -t 9p -o "$o9,cache=mmap" "$tag" "/newroot$path" || fail "mount $tag on $path"
done < "/newroot$RUN/shares"
mkdir -p "/newroot/lib/modules/$KVER"
mount -o bind "/newroot$CACHE/k-$KVER/lib/modules/$KVER" "/newroot/lib/modules/$KVER" || fail "bind modules"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /newroot/run
mount -o move /dev /newroot/dev
mount -o move /sys /newroot/sys
mount -o move /proc /newroot/proc
exec switch_root /newroot /bin/bash "$RUN/boot.sh" "$RUN"
EOF_INIT
    chmod +x "$ir/init"
    mknod -m 600 "$ir/dev/console" c 5 1
    ( cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet ) > "$kd/initrd.cpio.tmp"
    mv "$kd/initrd.cpio.tmp" "$kd/initrd.cpio"
    rm -rf "$ir"
    echo "$IMAGE_VERSION" > "$kd/.image-version"
  fi
}

exec 9>"$SYSVM_CACHE/.lock"
flock 9
KVER=${SYSVM_KVER:-}
if [ -z "$KVER" ]; then   # prefer a cached kernel: no network, stable in CI
  for d in "$SYSVM_CACHE"/k-*/ "$RXEVM_CACHE"/k-*/; do
    [ -f "$d/.kernel-ok" ] && { KVER=$(basename "$d"); KVER=${KVER#k-}; break; }
  done
fi
if [ -z "$KVER" ]; then
  # nothing cached: refresh the index first, since Debian drops old kernel ABIs
  note "resolving the current linux-image-amd64 (apt-get update)"
  apt-get update >/dev/null 2>&1 || note "apt-get update failed; using the current index"
  KVER=$(apt-cache depends linux-image-amd64 2>/dev/null \
           | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -n1)
  [ -n "$KVER" ] || die "cannot resolve linux-image-amd64; set SYSVM_KVER"
fi
build_image "$KVER"
flock -u 9
exec 9>&-
KD="$SYSVM_CACHE/k-$KVER"

# ------------------------------------------------------------------ per run
RUN=$(mktemp -d "$SYSVM_CACHE/run.XXXXXX")
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
        -virtfs "local,path=$RUN,mount_tag=sysvmrun,security_model=none")
: > "$RUN/shares"
n=0
add_rw() {
  local d
  d=$(cd "$1" 2>/dev/null && pwd -P) || die "SYSVM_RW: no such directory: $1"
  case "$d" in /|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/run|/run/*|"$SYSVM_CACHE"|"$SYSVM_CACHE"/*)
    note "not sharing $d read-write (it stays read-only)"; return;; esac
  case "$d" in *[[:space:],]*) note "cannot share '$d' read-write (space/comma in path)"; return;; esac
  virtfs+=(-virtfs "local,path=$d,mount_tag=rw$n,security_model=none")
  echo "rw$n $d" >> "$RUN/shares"; n=$((n + 1))
}
if [ "$SYSVM_SHARE_CWD" = 1 ]; then add_rw "$CWD"; fi
IFS=: read -r -a extra <<< "$SYSVM_RW" || true
for d in "${extra[@]}"; do if [ -n "$d" ]; then add_rw "$d"; fi; done
awk '{ print length($2), $0 }' "$RUN/shares" | sort -n | cut -d' ' -f2- > "$RUN/shares.sorted"
mv "$RUN/shares.sorted" "$RUN/shares"

# CMD's environment: everything exported here, minus shell/session internals and what systemd
# sets for a service itself
{
  declare -px | grep -Ev '^declare -[a-zA-Z]*r|^declare -x (PWD|OLDPWD|SHLVL|_|BASHOPTS|SHELLOPTS|BASH_[A-Z_]*|HOSTNAME|TERMCAP|COLUMNS|LINES|DBUS_[A-Z_]*|XDG_[A-Z_]*|SSH_AUTH_SOCK|INVOCATION_ID|JOURNAL_STREAM|NOTIFY_SOCKET|LISTEN_[A-Z_]*|WATCHDOG_[A-Z_]*|SYSTEMD_[A-Z_]*|MANAGERPID|CREDENTIALS_DIRECTORY)=' || true
  echo 'export SYSVM=1'
  printf 'SYSVM_CWD=%q\n' "$CWD"
  printf 'SYSVM_ARGV=('; printf '%q ' "$@"; printf ')\n'
} > "$RUN/env"

# Boot script (host bash as PID 1 before systemd): the guest-only configuration lives in the
# tmpfs overlay, then systemd takes over as PID 1.  Written on every run: editing needs no
# image rebuild.
cat > "$RUN/boot.sh" <<'EOF_BOOT'
#!/bin/bash
RUN=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The host may be a container: systemd must not think it runs in one (it would ignore the
# kernel command line, among others).
rm -f /.dockerenv /run/.containerenv
# No disks: the host's fstab (if any) names devices this VM does not have.
: > /etc/fstab
echo skhvm > /etc/hostname
# The VM has no NIC, no ttys to log in on and no clock to sync: waiting for any of them would
# only cost boot time.  None of this touches the units under test.
for u in systemd-networkd-wait-online.service NetworkManager-wait-online.service \
         ifupdown-wait-online.service networking.service systemd-timesyncd.service \
         systemd-pstore.service timers.target systemd-binfmt.service \
         proc-sys-fs-binfmt_misc.automount; do
  ln -sfn /dev/null "/etc/systemd/system/$u"
done
# /tmp is the host's (read-only lower layer): create it, never empty it at boot (Debian's
# `D /tmp` would walk, over 9p, everything the host keeps there).
mkdir -p /etc/tmpfiles.d
echo 'd /tmp 1777 root root -' > /etc/tmpfiles.d/tmp.conf
cat > /etc/systemd/system/skh-vm.target <<EOF
[Unit]
Description=skh systemd test VM: basic.target, then the command
Requires=basic.target skh-vm-cmd.service
After=basic.target
AllowIsolate=yes
EOF
cat > /etc/systemd/system/skh-vm-cmd.service <<EOF
[Unit]
Description=skh systemd test VM command
After=basic.target
[Service]
Type=exec
ExecStart=/bin/bash $RUN/cmd.sh $RUN
StandardInput=null
StandardOutput=journal
EOF
exec /lib/systemd/systemd
EOF_BOOT

cat > "$RUN/cmd.sh" <<'EOF_CMD'
#!/bin/bash
# Runs CMD (as the skh-vm-cmd service) and powers the VM off with its status.
RUN=$1
finish() {
  journalctl -b --no-pager -o short-monotonic > "$RUN/journal" 2>/dev/null
  echo "$1" > "$RUN/rc.tmp" && mv "$RUN/rc.tmp" "$RUN/rc"
  sync
  echo o > /proc/sysrq-trigger; sleep 10
}
. "$RUN/env"
cd "$SYSVM_CWD" || { echo "systemd-vm: cannot cd to $SYSVM_CWD" > /dev/ttyS1; finish 125; }
# CMD's stdout+stderr go to a file (so CMD sees a plain file, as in CI, not a tty), which
# `tail -f` streams to the 2nd serial port, which qemu streams to our stdout.
out=/run/sysvm-cmd.out
: > "$out"
stty -F /dev/ttyS1 raw -echo
exec 3>/dev/ttyS1
sleep infinity & marker=$!
tail -c +1 -s 0.1 -f --pid="$marker" "$out" >&3 2>/dev/null & tailpid=$!
"${SYSVM_ARGV[@]}" >>"$out" 2>&1 3>&-
rc=$?
kill "$marker" 2>/dev/null
for i in $(seq 1 300); do kill -0 "$tailpid" 2>/dev/null || break; sleep 0.1; done
kill "$tailpid" 2>/dev/null
exec 3>&-
finish "$rc"
EOF_CMD

# --------------------------------------------------------------------- boot
# TCG only: the build machines' KVM is PVM, which hangs a stock kernel (notes/rxe-vm.md).
# no_timer_check: on a starved host TCG runs the guest so slowly that the kernel's IO-APIC timer
# check fails and it panics at boot (found by tools/rxe-vm); the check has no use in a VM.
kernel="$KD/vmlinux"; [ -f "$kernel" ] || kernel="$KD/vmlinuz"
timeout -k 10 "$SYSVM_TIMEOUT" qemu-system-x86_64 \
  -nodefaults -no-user-config -display none -no-reboot \
  -accel tcg,thread=multi -cpu max -smp "$SYSVM_SMP" -m "$SYSVM_MEM" \
  -kernel "$kernel" -initrd "$KD/initrd.cpio" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable no_timer_check nokaslr fstab=no systemd.unit=skh-vm.target systemd.show_status=0 systemd.firstboot=0 sysvm.run=$RUN sysvm.kver=$KVER sysvm.cache=$SYSVM_CACHE" \
  -serial "file:$RUN/console.log" \
  -chardev stdio,id=out,signal=off -serial chardev:out \
  -device virtio-rng-pci \
  "${virtfs[@]}" < /dev/null &
QPID=$!
set +e
wait "$QPID"; qrc=$?
set -e
QPID=

if [ -n "$SYSVM_JOURNAL" ] && [ -f "$RUN/journal" ]; then cp "$RUN/journal" "$SYSVM_JOURNAL"; fi
if [ -f "$RUN/rc" ]; then
  rc=$(cat "$RUN/rc")
  if [ "$SYSVM_VERBOSE" = 1 ] || [ "$rc" = 125 ]; then
    note "---- guest console ----"; cat "$RUN/console.log" >&2 || true
  fi
  exit "$rc"
fi
note "VM ended without a result (qemu/timeout rc=$qrc)"
note "---- guest console (tail) ----"; tail -n 60 "$RUN/console.log" >&2 || true
[ "$qrc" = 124 ] && exit 124
exit 125
