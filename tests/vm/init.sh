#!/bin/sh
# PID 1 of the `cargo xtask vm-test` guest (busybox sh on a Debian kernel, no network).
#
# Serial ports (set up by the host as separate `-serial file:` ports):
#   ttyS0  kernel console and this script's own messages
#   ttyS1  the scenario's output (the test harness output the host prints and counts)
#   ttyS2  one line "TTDP_VM_EXIT=<code>": the scenario's exit status
# The host writes /etc/ttdp-vm.env (scenario name, .ko locations, test harness args).
# Whatever happens, this script ends with `poweroff -f`; if it dies instead, the kernel panics,
# `panic=-1` reboots and QEMU's `-no-reboot` turns that into an exit.

/bin/busybox mkdir -p /proc /sys /dev /tmp /run /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/opt/ttdp/bin:/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/root

mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t securityfs securityfs /sys/kernel/security
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

for port in /dev/ttyS1 /dev/ttyS2; do
  stty -F "$port" raw -echo
done

. /etc/ttdp-vm.env
export TTDP_VM TTDP_VM_SCENARIO TTDP_VM_KERNEL_RELEASE TTDP_VM_KO_DIR TTDP_VM_KO_VERSIONS \
  TTDP_VM_KO_BROKEN_VERSION TTDP_VM_STUB_REPO TTDP_VM_HOST_USR
export RUST_BACKTRACE=1
# The kernel hands init TERM=linux; the output ends up in log files, so no colour codes.
export TERM=dumb

# Scenarios that build modules get the host's /usr (gcc, make, git, kernel headers) read-only
# over 9p; /lib and /lib64 already lead into it. Host tools then come before busybox's.
# A scenario sharing other host folders gets the 9p modules too, and mounts them itself.
for module in $TTDP_VM_9P_MODULES; do
  insmod "$TTDP_VM_9P_MODULE_DIR/$module" || echo "ttdp-vm: insmod $module failed"
done
if [ "$TTDP_VM_HOST_USR" = 1 ]; then
  if mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostusr /usr; then
    export PATH=/opt/ttdp/bin:/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin
  else
    echo "ttdp-vm: mounting the host's /usr over 9p failed"
    echo "TTDP_VM_EXIT=125" >/dev/ttyS2
    poweroff -f
  fi
fi

echo "ttdp-vm: scenario $TTDP_VM_SCENARIO on $(uname -r)"
eval "set -- $TTDP_VM_TEST_ARGS"
/scenario.sh "$@" >/dev/ttyS1 2>&1
status=$?
echo "ttdp-vm: scenario $TTDP_VM_SCENARIO exited with $status"

# Closing a serial port waits until its output has been sent, so nothing is lost at poweroff.
echo "TTDP_VM_EXIT=$status" >/dev/ttyS2
sync
poweroff -f
