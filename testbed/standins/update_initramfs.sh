#!/bin/sh
# Stand-in for update-initramfs on a testbed host: records each run (the roles' handler must run it
# exactly when the modprobe override changes) and prints what Debian's tool prints.
set -e
kernel=$(uname -r)
mkdir -p /var/lib/testbed
echo "$(date +%s) $*" >> /var/lib/testbed/update-initramfs.log
case " $* " in
  *" -u "*) echo "update-initramfs: Generating /boot/initrd.img-${kernel}" ;;
  *) echo "Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]" >&2; exit 1 ;;
esac
