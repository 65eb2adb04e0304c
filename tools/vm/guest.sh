# Guest side of the skh test VMs (bash, host userland): tools/vm/common.sh copies this file to
# "$RUN/guest.sh" and the VM's own scripts source it there after setting RUN.
# shellcheck shell=bash
# shellcheck source=/dev/null  # written per run
. "$RUN/conf"   # VM_TAG, plus what the VM's script added

vm_up() { local u; read -r u _ < /proc/uptime; echo "$VM_TAG: $* (${u}s)"; }

# Hand STATUS to the host (the run dir is a 9p share) and power off.  Under systemd the boot's
# journal is saved too (the host copies it out on request).
vm_finish() {
  if [ -d /run/systemd/system ]; then
    journalctl -b --no-pager -o short-monotonic > "$RUN/journal" 2>/dev/null
  fi
  echo "$1" > "$RUN/rc.tmp" && mv "$RUN/rc.tmp" "$RUN/rc"
  sync
  echo o > /proc/sysrq-trigger; sleep 10
}

# Run CMD (VM_ARGV, from "$RUN/env", which the caller has sourced at top level: its `declare -x`
# lines would make locals in a function) in VM_CWD, then vm_finish with its status.
# CMD's stdout+stderr go to a file on tmpfs (so CMD sees a plain file, as in CI, not a tty),
# which `tail -f` streams to the 2nd serial port, which qemu streams to the host's stdout.  CMD
# runs in the foreground (normal signal dispositions); once it exits, tail drains the file and
# stops, so leftover background processes of CMD cannot hold the run open.
vm_run_cmd() {
  local out=/run/skhvm-cmd.out rc marker tailpid
  stty -F /dev/ttyS1 raw -echo
  exec 3>/dev/ttyS1
  cd "$VM_CWD" || { echo "$VM_TAG: cannot cd to $VM_CWD" >&3; vm_finish 125; }
  : > "$out"
  sleep infinity & marker=$!
  tail -c +1 -s 0.1 -f --pid="$marker" "$out" >&3 2>/dev/null & tailpid=$!
  "${VM_ARGV[@]}" >>"$out" 2>&1 3>&-
  rc=$?
  kill "$marker" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$tailpid" 2>/dev/null || break; sleep 0.1; done
  kill "$tailpid" 2>/dev/null
  exec 3>&-   # the last close of the tty waits until its output has drained
  vm_up "command exited with $rc"
  vm_finish "$rc"
}
