#!/bin/sh
# Scenario "guest-build": the guest can build a module itself, as the agent does on a node
# (issue 6): gcc, make and the kernel headers come from the host's /usr over 9p. Builds the stub
# module from source at version 4.0.0, loads it, checks the version sysfs reports, unloads it.
set -eu
release=$(uname -r)
src=/tmp/stub-build
mkdir -p "$src"
cp /stub-module/Kbuild /stub-module/tenstorrent.c "$src"/

start=$(date +%s)
make -C "/lib/modules/$release/build" M="$src" TT_STUB_VERSION=4.0.0 modules
echo "guest-build: make took $(($(date +%s) - start)) s"

insmod "$src/tenstorrent.ko"
version=$(cat /sys/module/tenstorrent/version)
rmmod tenstorrent
if [ "$version" = 4.0.0 ] && [ ! -e /sys/module/tenstorrent ]; then
  echo "guest-build: 1 passed, 0 failed"
else
  echo "guest-build: module reported version '$version' (want 4.0.0) or did not unload"
  echo "guest-build: 0 passed, 1 failed"
  exit 1
fi
