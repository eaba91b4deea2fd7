#!/bin/sh
# Scenario trixie-kernel: the VM runs Debian 13's kernel (the one the gcc 14 builder image's
# kbuild serves), and the host put the stub module that image's toolchain built against this
# kernel's headers at /image-ko/tenstorrent.ko. Here: this is that kernel, built by gcc 14; the
# module loads in it, reports the version it was built with and unloads.
SCENARIO=trixie_kernel
. /scenario-lib.sh

loaded_version() { cat /sys/module/tenstorrent/version 2>/dev/null; }

running_the_builders_kernel() {
  echo "running $(uname -r), want $TTDP_VM_BUILDER_RELEASE"
  [ "$(uname -r)" = "$TTDP_VM_BUILDER_RELEASE" ] || return 1
  # /proc/version names the compiler the agent picks the builder image by
  head -c 300 /proc/version
  echo
  grep -q "gcc-$TTDP_VM_BUILDER_GCC " /proc/version
}

image_module_loads_and_unloads() {
  insmod /image-ko/tenstorrent.ko || return 1
  v=$(loaded_version)
  echo "loaded the gcc $TTDP_VM_BUILDER_GCC image's module: version $v (want $TTDP_VM_IMAGE_KO_VERSION)"
  [ "$v" = "$TTDP_VM_IMAGE_KO_VERSION" ] || return 1
  rmmod tenstorrent || return 1
  [ ! -e /sys/module/tenstorrent ]
}

check kernel_is_the_gcc14_builders running_the_builders_kernel
check gcc14_image_module_loads_and_unloads image_module_loads_and_unloads
finish
