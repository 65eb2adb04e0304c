#!/bin/sh
# skh test VM stage 1 (busybox, PID 1 of the initramfs; tools/vm/common.sh builds it): load the
# modules listed in /mods/order, mount the host root (9p, read-only) under a tmpfs overlay, the
# per-run dir and the read-write shares at their host paths, bind this kernel's module tree where
# modprobe looks for it, then switch_root and run the VM's own "$RUN/stage2.sh" with bash.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
up() { read -r u _ < /proc/uptime; echo "skhvm-init: $* ${u}s"; }
fail() { echo "skhvm-init: FATAL: $*"; cat /proc/mounts; echo o > /proc/sysrq-trigger; sleep 5; poweroff -f; }
up start
# shellcheck disable=SC2013  # the command line is words
for w in $(cat /proc/cmdline); do
  case "$w" in skhvm.run=*) RUN=${w#skhvm.run=};; skhvm.kver=*) KVER=${w#skhvm.kver=};;
               skhvm.cache=*) CACHE=${w#skhvm.cache=};; esac
done
if [ -z "$RUN" ] || [ -z "$KVER" ] || [ -z "$CACHE" ]; then fail "skhvm.run/kver/cache missing on the command line"; fi
while read -r m; do insmod "/mods/$m" || fail "insmod $m"; done < /mods/order
up "modules loaded"
o9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$o9,ro,cache=loose" hostroot /lower || fail "mount 9p hostroot"
mount -t tmpfs -o mode=755 tmpfs /ovl
mkdir -p /ovl/u /ovl/w
mount -t overlay -o lowerdir=/lower,upperdir=/ovl/u,workdir=/ovl/w overlay /newroot || fail "overlay mount"
# a 9p channel can be mounted only once, so mount each share directly in place
mkdir -p "/newroot$RUN"
mount -t 9p -o "$o9,cache=mmap" skhvmrun "/newroot$RUN" || fail "mount run dir"
while read -r tag path; do
  mkdir -p "/newroot$path"
  mount -t 9p -o "$o9,cache=mmap" "$tag" "/newroot$path" || fail "mount $tag on $path"
done < "/newroot$RUN/shares"
mkdir -p "/newroot/lib/modules/$KVER"
mount -o bind "/newroot$CACHE/k-$KVER/lib/modules/$KVER" "/newroot/lib/modules/$KVER" || fail "bind modules"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /newroot/run
up "switch_root"
mount -o move /dev /newroot/dev
mount -o move /sys /newroot/sys
mount -o move /proc /newroot/proc
exec switch_root /newroot /bin/bash "$RUN/stage2.sh" "$RUN"
