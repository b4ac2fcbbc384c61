#!/bin/bash
# run.sh's checks on a host with no GPU made to look like one, as far as anything but the kernel
# driver goes: NVIDIA's real 550.163.01 userspace (tests/realdriver/fetch.sh, the .run layout)
# in the library directory and /usr/bin, two GPUs in /proc/driver/nvidia and sysfs, their device
# nodes (majors no kernel driver serves: open() says ENXIO) and NVIDIA's majors in /proc/devices.
#
#   simulate.sh KIT EVIDENCE SCRATCH SMI     (as root, in a private mount namespace of its own:
#                                             tests/gpu/selftest.sh runs it under unshare -m)
#
# Every change is a mount in this namespace (overlays whose upper layers are on a tmpfs, tmpfs
# over /dev, /proc/driver and the PCI devices): the host is untouched and all of it goes when
# the namespace does. Then run.sh's checks run (`run.sh --inner`, SMI standing in for
# nvidia-smi), and their output is this script's.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KIT=$1 E=$2 S=$3 SMI=$4
[ "$(readlink /proc/1/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] ||
    { echo "simulate.sh: run me in a private mount namespace (unshare -m)" >&2; exit 2; }
mount --make-rprivate /

# Under run.sh's own scratch ($S/run), which its view of the host leaves out.
SIM=$S/run/sim
mkdir -p "$SIM"
mount -t tmpfs -o size=2g,mode=700 gpu-sim "$SIM"
F=$SIM/driver
"$HERE/../realdriver/fetch.sh" install run "$F" >/dev/null
# union DIR: DIR shows the driver's files over the host's own (read-only).
union() {
    [ -d "$F$1" ] || return 0
    mount -t overlay gpu-sim-union -o "lowerdir=$F$1:$1" "$1"
}
union /usr/lib/x86_64-linux-gnu
union /usr/bin
# The loader cache lists the driver, as the installer's ldconfig leaves it.
mkdir -p "$SIM/etc/upper" "$SIM/etc/work"
mount -t overlay gpu-sim-etc -o "lowerdir=/etc,upperdir=$SIM/etc/upper,workdir=$SIM/etc/work" /etc
ldconfig

# The kernel's side: /proc/driver/nvidia, /proc/devices, sysfs, /dev.
mount -t tmpfs -o size=1m,mode=755 gpu-sim-proc /proc/driver
mkdir -p /proc/driver/nvidia/gpus
printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Wed Oct  1 20:32:12 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n' \
    >/proc/driver/nvidia/version
printf 'ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n' >/proc/driver/nvidia/params
{ cat /proc/devices | sed '/^Block devices:/,$d' | grep -v '^$'
  printf '195 nvidia\n508 nvidia-uvm\n\n'; sed -n '/^Block devices:/,$p' /proc/devices; } >"$SIM/devices"
mount --bind "$SIM/devices" /proc/devices
mount -t tmpfs -o size=1m,mode=755 gpu-sim-pci /sys/bus/pci/devices
minor=0
while read -r bus uuid; do
    mkdir -p "/proc/driver/nvidia/gpus/$bus" "/sys/bus/pci/devices/$bus"
    printf 'Model: \t\t NVIDIA L4\nIRQ:   \t\t %s\nGPU UUID: \t %s\nVideo BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %s\nGPU Firmware: \t 550.163.01\nGPU Excluded:\t No\n' \
        $((100 + minor)) "$uuid" "$bus" "$minor" >"/proc/driver/nvidia/gpus/$bus/information"
    echo 0x10de >"/sys/bus/pci/devices/$bus/vendor"
    echo 0x030200 >"/sys/bus/pci/devices/$bus/class"
    minor=$((minor + 1))
done < <("$SMI" -q | awk '/^GPU [0-9a-fA-F]+:/ {bus = tolower(substr($2, 5))} /GPU UUID/ {print bus, $NF}')
mkdir -p "$SIM/hostdev"
mount --bind /dev "$SIM/hostdev"
mount -t tmpfs -o mode=755,size=1m gpu-sim-dev /dev
for n in null zero full random urandom tty ptmx; do
    touch "/dev/$n" && mount --bind "$SIM/hostdev/$n" "/dev/$n"
done
mkdir -p /dev/pts /dev/shm /dev/net
mount --bind "$SIM/hostdev/pts" /dev/pts
ln -s /proc/self/fd /dev/fd
for i in $(seq 0 $((minor - 1))); do mknod -m 666 "/dev/nvidia$i" c 195 "$i"; done
mknod -m 666 /dev/nvidiactl c 195 255
mknod -m 666 /dev/nvidia-uvm c 508 0
mknod -m 666 /dev/nvidia-uvm-tools c 508 1

exec "$HERE/run.sh" --inner "$KIT" "$E" "$S/run" 3 "$SMI"
