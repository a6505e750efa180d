#!/bin/bash
# rootfs.sh DIR PACKAGES_FILE MIRROR — makes the Debian bookworm root file
# system of the MariaDB and Prometheus images in DIR: debootstrap
# --variant=minbase, then the packages of PACKAGES_FILE with apt-get inside
# the chroot. build-images.sh
# runs it (as root) and hashes this file with the package list, so editing
# either rebuilds the base image.
set -euo pipefail
dir=$1 packages=$2 mirror=${3:-http://deb.debian.org/debian}
debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
  { tail -20 "$dir.debootstrap.log"; exit 1; }
# No daemon may start inside the chroot while packages install.
printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
chmod +x "$dir/usr/sbin/policy-rc.d"
# The tree is a throwaway until docker import: dpkg need not fsync each
# file it unpacks (beside CI's MariaDB tests, whose commits fsync too).
echo force-unsafe-io >"$dir/etc/dpkg/dpkg.cfg.d/triage-unsafe-io"
# Prometheus' console needs moment-timezone-with-data.min.js alone; the
# package's data/ (per-zone files, 212 MB, a third of the whole tree) is
# left unpacked, so docker import and every image on it stay that much
# smaller.
echo 'path-exclude=/usr/share/javascript/moment-timezone/data/*' >"$dir/etc/dpkg/dpkg.cfg.d/triage-exclude"
chroot "$dir" apt-get update -qq
DEBIAN_FRONTEND=noninteractive chroot "$dir" apt-get install -y -qq --no-install-recommends \
  $(grep -v '^#' "$packages") >/dev/null
chroot "$dir" apt-get clean
rm -f "$dir/etc/dpkg/dpkg.cfg.d/triage-unsafe-io"
rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/lib/mysql/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/*
