# tools/vm/common.sh: the throw-away qemu VM that skh's test VMs share, sourced by
# tools/rxe-vm/run-in-rxe-vm.sh (soft-RoCE) and tools/systemd-vm/run-in-systemd-vm.sh (systemd).
# shellcheck shell=bash
#
# A VM boots a stock Debian kernel (linux-image-<abi>-amd64) with a busybox initramfs whose init
# (stage1-init.sh) mounts the HOST's root read-only over 9p under a tmpfs overlay (writes are
# thrown away), the per-run dir and the read-write shares at their host paths, and then runs the
# VM's own "$RUN/stage2.sh" with the host's bash.  That script sources "$RUN/guest.sh"
# (guest.sh) and ends in vm_run_cmd, which runs CMD and hands its exit status back through the
# run dir.  CMD's stdout+stderr reach our stdout through the 2nd serial port.
#
# The caller sets VM_NAME (message prefix) and VM_PREFIX (its knobs' prefix, e.g. RXEVM), then:
#   vm_init "$@"                        knobs: ${VM_PREFIX}_{CACHE,KVER,MEM,SMP,TIMEOUT,RW,
#                                       SHARE_CWD,VERBOSE,INSTALL}; CACHE and TIMEOUT have no
#                                       default here
#   vm_host_packages [PKG...]           installs the common host packages + PKGs if missing
#   vm_image KERNEL_FN "MODS" [DIR...]  kernel + initramfs in the cache (see there); sets KVER, KD
#   vm_run_dir "$@"                     the per-run dir RUN: shares, CMD's environment, guest.sh
#   ...                                 the caller writes "$RUN/stage2.sh" (+ "$RUN/conf" lines)
#   vm_boot [KERNEL ARGS...]            qemu until it exits
#   vm_exit                             exit with CMD's status (124 timeout, 125 VM failure)
# Variables it uses beside the knobs: VM_ACCEL (auto|kvm|tcg, default auto), VM_ENV_DROP (a
# regex of more environment variables to keep from CMD).

# Bump when the stage-1 init or the initramfs layout changes: it names the cached initramfs
# (initrd-<version>.cpio), so scripts of different versions sharing a cache never swap it under
# each other.
VM_IMAGE_VERSION=11
VM_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)

vm_die() { echo "$VM_NAME: $*" >&2; exit 125; }
vm_note() { echo "$VM_NAME: $*" >&2; }

vm_init() {   # "$@" = CMD [ARGS...]
  local k n
  [ $# -ge 1 ] || vm_die "usage: $0 CMD [ARGS...]"
  for k in CACHE: KVER: TIMEOUT: MEM:2G SMP:2 RW: SHARE_CWD:1 VERBOSE:0 INSTALL:1; do
    n=${VM_PREFIX}_${k%%:*}
    printf -v "VM_${k%%:*}" '%s' "${!n:-${k#*:}}"
  done
  VM_ACCEL=${VM_ACCEL:-auto}
  case "$VM_CACHE" in /*) ;; *) vm_die "${VM_PREFIX}_CACHE must be an absolute path";; esac
  case "$VM_CACHE" in *[[:space:]]*) vm_die "${VM_PREFIX}_CACHE must not contain spaces";; esac
}

# ------------------------------------------------------------ host packages
vm_find_busybox() {
  local b
  BUSYBOX=
  for b in /bin/busybox /usr/bin/busybox; do
    if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then BUSYBOX=$b; return 0; fi   # static only
  done
  return 1
}

vm_host_packages() {   # PKG... = the caller's missing packages
  local need=("$@")
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  vm_find_busybox || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  command -v xz >/dev/null || need+=(xz-utils)
  command -v depmod >/dev/null || need+=(kmod)
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$VM_INSTALL" != 1 ] || [ "$(id -u)" != 0 ]; then vm_die "missing host packages: ${need[*]}"; fi
    vm_note "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
      || { apt-get update >/dev/null 2>&1; apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; } \
      || vm_die "apt-get install ${need[*]} failed"
    vm_find_busybox || true
  fi
  [ -n "$BUSYBOX" ] || vm_die "no static busybox (install busybox-static)"
}

# ------------------------------------------------- kernel + initramfs (cached)
# Download linux-image-KVER with apt into DIR: DIR/vmlinuz and DIR/lib/modules/KVER (no depmod).
vm_fetch_kernel() {   # KVER DIR
  local kver=$1 dir=$2 tmp
  vm_note "fetching linux-image-$kver (once)"
  tmp=$(mktemp -d "$VM_CACHE/dl.XXXXXX")
  dl() { ( cd "$tmp" && apt-get download -o APT::Sandbox::User=root "linux-image-$kver" ) >/dev/null 2>&1; }
  dl || { apt-get update >/dev/null 2>&1; dl; } || { rm -rf "$tmp"; vm_die "apt-get download linux-image-$kver failed"; }
  mkdir -p "$dir/x" "$dir/lib/modules"
  dpkg-deb -x "$tmp"/linux-image-"$kver"_*.deb "$dir/x"
  rm -rf "$tmp"
  mv "$dir/x/boot/vmlinuz-$kver" "$dir/vmlinuz"
  if [ -d "$dir/x/lib/modules/$kver" ]; then mv "$dir/x/lib/modules/$kver" "$dir/lib/modules/"
  else mv "$dir/x/usr/lib/modules/$kver" "$dir/lib/modules/"; fi   # merged-/usr packages
  rm -rf "$dir/x"
}

# The .ko files that MODULEs need from DIR/lib/modules/KVER (depmod'ed), dependencies first,
# each once (built-in modules need none).
vm_mod_deps() {   # DIR KVER MODULE...
  local dir=$1 kver=$2 m p
  shift 2
  for m in "$@"; do
    while read -r _ p _; do
      case "$p" in /*.ko) echo "$p";; esac
    done < <(modprobe -d "$dir" -S "$kver" --show-depends "$m")
  done | awk '!seen[$0]++'
}

# Uncompressed ELF vmlinux: qemu boots it through the PVH entry point, skipping the real-mode
# setup and the XZ decompression, which under TCG costs ~3.5 s per boot.  vm_boot falls back to
# the bzImage if this fails.
vm_extract_vmlinux() {   # DIR (holding vmlinuz)
  local kd=$1 off
  off=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$kd/vmlinuz" | head -n1 | cut -d: -f1 || true)
  # (xz stops after the first stream; process substitution, not a pipe, so tail's SIGPIPE on
  # the trailing bytes does not trip pipefail)
  if [ -n "$off" ] && xz -dc --single-stream < <(tail -c +$((off + 1)) "$kd/vmlinuz") > "$kd/vmlinux.tmp" 2>/dev/null \
     && [ "$(head -c4 "$kd/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    mv "$kd/vmlinux.tmp" "$kd/vmlinux"
  else
    rm -f "$kd/vmlinux.tmp"; vm_note "could not extract vmlinux; booting the bzImage (slower)"
  fi
}

vm_build_initrd() {   # KD KVER "MODS": KD/initrd-$VM_IMAGE_VERSION.cpio, loading MODS (+ deps)
  local kd=$1 kver=$2 mods=$3 ir="$1/initrd.d" a p
  vm_note "building initramfs for $kver"
  rm -rf "$ir"; mkdir -p "$ir"/{bin,dev,proc,sys,lower,ovl,newroot,mods}
  cp "$BUSYBOX" "$ir/bin/busybox"
  for a in sh mount mkdir insmod switch_root cat echo sleep poweroff; do ln -s busybox "$ir/bin/$a"; done
  : > "$ir/mods/order"
  # shellcheck disable=SC2086  # MODS is a word list
  while read -r p; do
    cp "$p" "$ir/mods/"; basename "$p" >> "$ir/mods/order"
  done < <(vm_mod_deps "$kd" "$kver" $mods)
  install -m 755 "$VM_LIB/stage1-init.sh" "$ir/init"
  mknod -m 600 "$ir/dev/console" c 5 1
  ( cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet ) > "$kd/initrd.cpio.tmp"
  mv "$kd/initrd.cpio.tmp" "$kd/initrd-$VM_IMAGE_VERSION.cpio"
  rm -rf "$ir"
}

# The kernel ABI: ${VM_PREFIX}_KVER, else the last one cached in the first DIR that has one (no
# network, stable in CI), else whatever linux-image-amd64 depends on now.
vm_resolve_kver() {   # DIR...
  local cache d
  KVER=$VM_KVER
  for cache in "$@"; do
    [ -z "$KVER" ] || return 0
    for d in "$cache"/k-*/; do
      if [ -f "$d/.kernel-ok" ]; then KVER=$(basename "$d"); KVER=${KVER#k-}; fi
    done
  done
  [ -z "$KVER" ] || return 0
  # nothing cached: refresh the index first, since Debian drops old kernel ABIs from the mirror
  # when a new one lands
  vm_note "resolving the current linux-image-amd64 (apt-get update)"
  apt-get update >/dev/null 2>&1 || vm_note "apt-get update failed; using the current index"
  KVER=$(apt-cache depends linux-image-amd64 2>/dev/null \
           | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -n1)
  [ -n "$KVER" ] || vm_die "cannot resolve linux-image-amd64; set ${VM_PREFIX}_KVER"
}

# Under the cache's lock: resolve KVER (from VM_CACHE, then the other DIRs), let KERNEL_FN KVER KD
# fill KD=VM_CACHE/k-KVER with vmlinuz and a depmod'ed lib/modules/KVER (once), and build the
# initramfs loading MODS (+ their dependencies) for this image version.
vm_image() {   # KERNEL_FN "MODS" [DIR...]
  local fn=$1 mods=$2
  shift 2
  mkdir -p "$VM_CACHE"
  exec 9>"$VM_CACHE/.lock"
  flock 9
  vm_resolve_kver "$VM_CACHE" "$@"
  KD="$VM_CACHE/k-$KVER"
  if [ ! -f "$KD/.kernel-ok" ]; then
    rm -rf "$KD"; mkdir -p "$KD"
    "$fn" "$KVER" "$KD"
    if [ ! -f "$KD/vmlinux" ]; then vm_extract_vmlinux "$KD"; fi
    touch "$KD/.kernel-ok"
  fi
  if [ ! -f "$KD/initrd-$VM_IMAGE_VERSION.cpio" ]; then vm_build_initrd "$KD" "$KVER" "$mods"; fi
  flock -u 9
  exec 9>&-
}

# ------------------------------------------------------------------ per run
vm_add_rw() {   # DIR: share it read-write at its host path
  local d
  d=$(cd "$1" 2>/dev/null && pwd -P) || vm_die "${VM_PREFIX}_RW: no such directory: $1"
  case "$d" in /|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/run|/run/*|"$VM_CACHE"|"$VM_CACHE"/*)
    vm_note "not sharing $d read-write (it stays read-only)"; return;; esac
  case "$d" in *[[:space:],]*) vm_note "cannot share '$d' read-write (space/comma in path)"; return;; esac
  VM_VIRTFS+=(-virtfs "local,path=$d,mount_tag=rw$VM_NSHARES,security_model=none")
  echo "rw$VM_NSHARES $d" >> "$RUN/shares"; VM_NSHARES=$((VM_NSHARES + 1))
}

vm_cleanup() {
  if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then kill "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true; fi
  rm -rf "$RUN"
}

# RUN (removed on exit), its shares (the cwd unless ${VM_PREFIX}_SHARE_CWD=0, and
# ${VM_PREFIX}_RW), "$RUN/env" (CMD and its environment: everything exported here, minus
# shell/session internals and what refers to the host's service manager), "$RUN/conf" and
# "$RUN/guest.sh".
vm_run_dir() {   # CMD [ARGS...]
  local cwd d extra
  RUN=$(mktemp -d "$VM_CACHE/run.XXXXXX")
  QPID=
  trap vm_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cwd=$(pwd -P)
  VM_VIRTFS=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
             -virtfs "local,path=$RUN,mount_tag=skhvmrun,security_model=none")
  : > "$RUN/shares"
  VM_NSHARES=0
  if [ "$VM_SHARE_CWD" = 1 ]; then vm_add_rw "$cwd"; fi
  IFS=: read -r -a extra <<< "$VM_RW" || true
  for d in "${extra[@]}"; do if [ -n "$d" ]; then vm_add_rw "$d"; fi; done
  # mount parents before children
  awk '{ print length($2), $0 }' "$RUN/shares" | sort -n | cut -d' ' -f2- > "$RUN/shares.sorted"
  mv "$RUN/shares.sorted" "$RUN/shares"
  {
    declare -px | grep -Ev "^declare -[a-zA-Z]*r|^declare -x (PWD|OLDPWD|SHLVL|_|BASHOPTS|SHELLOPTS|BASH_[A-Z_]*|HOSTNAME|TERMCAP|COLUMNS|LINES|DBUS_[A-Z_]*|XDG_RUNTIME_DIR|SSH_AUTH_SOCK|INVOCATION_ID|JOURNAL_STREAM|NOTIFY_SOCKET|LISTEN_[A-Z_]*|WATCHDOG_[A-Z_]*|SYSTEMD_[A-Z_]*|MANAGERPID|CREDENTIALS_DIRECTORY${VM_ENV_DROP:+|$VM_ENV_DROP})=" || true
    echo "export $VM_PREFIX=1"
    printf 'VM_CWD=%q\n' "$cwd"
    printf 'VM_ARGV=('; printf '%q ' "$@"; printf ')\n'
  } > "$RUN/env"
  printf 'VM_TAG=%q\n' "${VM_PREFIX,,}" > "$RUN/conf"
  cp "$VM_LIB/guest.sh" "$RUN/guest.sh"
}

# --------------------------------------------------------------------- boot
vm_boot() {   # [KERNEL ARGS...]: sets VM_QRC (qemu's or timeout's status)
  local accel=$VM_ACCEL acc kernel
  if [ "$accel" = auto ]; then
    accel=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
  fi
  # shellcheck disable=SC2054  # qemu's comma-separated option
  case "$accel" in
    kvm) acc=(-accel kvm -cpu host) ;;
    tcg) acc=(-accel tcg,thread=multi -cpu max) ;;
    *) vm_die "${VM_PREFIX}_ACCEL must be auto, kvm or tcg" ;;
  esac
  kernel="$KD/vmlinux"; [ -f "$kernel" ] || kernel="$KD/vmlinuz"
  # serial0 = guest console -> $RUN/console.log; serial1 = CMD's output -> stdout (a serial
  # port, unlike virtio-console, keeps writing when qemu's stdin is /dev/null, as it is in CI)
  # no_timer_check: on a starved host (load 10+ on 2 cores) TCG runs the guest so slowly that
  # the kernel's IO-APIC timer check fails and it panics at boot ("IO-APIC + timer doesn't
  # work"); the check has no use in a VM
  timeout -k 10 "$VM_TIMEOUT" qemu-system-x86_64 \
    -nodefaults -no-user-config -display none -no-reboot \
    "${acc[@]}" -smp "$VM_SMP" -m "$VM_MEM" \
    -kernel "$kernel" -initrd "$KD/initrd-$VM_IMAGE_VERSION.cpio" \
    -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable no_timer_check nokaslr skhvm.run=$RUN skhvm.kver=$KVER skhvm.cache=$VM_CACHE $*" \
    -serial "file:$RUN/console.log" \
    -chardev stdio,id=out,signal=off -serial chardev:out \
    -device virtio-rng-pci \
    "${VM_VIRTFS[@]}" < /dev/null &
  QPID=$!
  set +e
  wait "$QPID"; VM_QRC=$?
  set -e
  QPID=
}

vm_exit() {
  local rc
  if [ -f "$RUN/rc" ]; then
    rc=$(cat "$RUN/rc")
    if [ "$VM_VERBOSE" = 1 ] || [ "$rc" = 125 ]; then
      vm_note "---- guest console ----"; cat "$RUN/console.log" >&2 || true
    fi
    exit "$rc"
  fi
  vm_note "VM ended without a result (qemu/timeout rc=$VM_QRC)"
  vm_note "---- guest console (tail) ----"; tail -n 60 "$RUN/console.log" >&2 || true
  [ "$VM_QRC" = 124 ] && exit 124
  exit 125
}
