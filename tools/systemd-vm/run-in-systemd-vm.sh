#!/usr/bin/env bash
# run-in-systemd-vm.sh CMD [ARGS...]   (skh's systemd test VM; `make test-systemd` uses it)
#
# Run CMD inside a throw-away qemu VM whose PID 1 is the host's own systemd, booted on a stock
# Debian kernel (linux-image-<abi>-amd64).  The VM is tools/vm/common.sh's, as tools/rxe-vm's
# is: the guest's root filesystem is the HOST's root, shared read-only over 9p with a tmpfs
# overlay on top (writes are thrown away), and the current directory is shared read-write
# unless SYSVM_SHARE_CWD=0.
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
SYSVM_TIMEOUT=${SYSVM_TIMEOUT:-1200}
SYSVM_JOURNAL=${SYSVM_JOURNAL-}
RXEVM_CACHE=${RXEVM_CACHE:-${TMPDIR:-/tmp}/skh-rxevm/cache}
# TCG only: the build machines' KVM is PVM, which hangs a stock kernel (notes/rxe-vm.md).
VM_NAME=run-in-systemd-vm VM_PREFIX=SYSVM VM_ACCEL=tcg
# CMD runs as a system service: none of the caller's XDG session variables
VM_ENV_DROP='XDG_[A-Z_]*'
# shellcheck source=tools/vm/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../vm/common.sh"
vm_init "$@"

if [ -x /lib/systemd/systemd ]; then vm_host_packages; else vm_host_packages systemd; fi

# Loaded by the stage-1 init from the initramfs (with their dependencies): the 9p root.
INITRD_MODS="virtio_pci 9pnet_virtio 9p overlay"
# Kept in the guest's /lib/modules for modprobe: veth and dummy for test namespaces, the rest
# for what systemd itself loads at boot (autofs4 for binfmt_misc, configfs, fuse, loop).
GUEST_MODS="$INITRD_MODS veth dummy autofs4 configfs fuse loop"

# The kernel image and its module tree: from tools/rxe-vm's cache when it holds this ABI (CI
# runs that VM first), else downloaded with apt.  Only vmlinux and GUEST_MODS are kept.
# shellcheck disable=SC2317  # called by vm_image
sysvm_kernel() {   # KVER KD
  local kver=$1 kd=$2 rx="$RXEVM_CACHE/k-$1" src f p rel
  if [ -f "$rx/.kernel-ok" ] && [ -f "$rx/lib/modules/$kver/modules.dep" ]; then
    vm_note "using the kernel cached by tools/rxe-vm ($kver)"
    cp "$rx/vmlinuz" "$kd/vmlinuz"
    if [ -f "$rx/vmlinux" ]; then cp "$rx/vmlinux" "$kd/vmlinux"; fi
    src=$rx   # read only from here on
  else
    src=$kd/src
    vm_fetch_kernel "$kver" "$src"
    mv "$src/vmlinuz" "$kd/vmlinuz"
    depmod -b "$src" "$kver"
  fi
  [ -f "$src/lib/modules/$kver/kernel/fs/9p/9p.ko" ] \
    || vm_die "linux-image-$kver has no 9p.ko (cloud flavour?); use the generic -amd64 one"
  mkdir -p "$kd/lib/modules/$kver"
  for f in modules.builtin modules.builtin.modinfo modules.order; do
    if [ -f "$src/lib/modules/$kver/$f" ]; then cp "$src/lib/modules/$kver/$f" "$kd/lib/modules/$kver/"; fi
  done
  # shellcheck disable=SC2086  # a word list
  while read -r p; do
    rel=${p#*/lib/modules/"$kver"/}
    mkdir -p "$kd/lib/modules/$kver/$(dirname "$rel")"
    cp "$p" "$kd/lib/modules/$kver/$rel"
  done < <(vm_mod_deps "$src" "$kver" $GUEST_MODS)
  depmod -b "$kd" "$kver"
  rm -rf "$kd/src"
}
vm_image sysvm_kernel "$INITRD_MODS" "$RXEVM_CACHE"

vm_run_dir "$@"
# Stage 2 (host bash as PID 1 before systemd): the guest-only configuration lives in the
# tmpfs overlay, then systemd takes over as PID 1.  Written on every run: editing needs no
# image rebuild.
cat > "$RUN/stage2.sh" <<'EOF_BOOT'
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
. "$RUN/guest.sh"
. "$RUN/env"
vm_run_cmd
EOF_CMD

vm_boot fstab=no systemd.unit=skh-vm.target systemd.show_status=0 systemd.firstboot=0
if [ -n "$SYSVM_JOURNAL" ] && [ -f "$RUN/journal" ]; then cp "$RUN/journal" "$SYSVM_JOURNAL"; fi
vm_exit
