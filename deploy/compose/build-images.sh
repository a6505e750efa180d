#!/bin/bash
# build-images.sh [ENV_FILE] — builds the compose bed's images without a
# registry, each tagged by a content hash of its inputs, and skips every
# image whose tag exists already (a second run takes seconds):
#
#   triage-rootfs:H1   Debian bookworm minbase + mariadb/packages.txt
#                      (MariaDB and Prometheus), made by mariadb/rootfs.sh
#                      with debootstrap and imported with docker import
#                      (H1: rootfs.sh + packages.txt)
#   triage-mariadb:H2  FROM triage-rootfs:H1 + entrypoint.sh
#                      (H2: H1 + the Dockerfile and entrypoint.sh)
#   triage-prometheus:H3  FROM triage-rootfs:H1, run as user prometheus
#                      (H3: H1 + prometheus/Dockerfile)
#   triage:H4          the production image, deploy/image/build.sh: FROM
#                      scratch + the static triage binary, CA certificates
#                      and user 65532 (H4: its whole build context)
#   triage-bed:H5      FROM triage:H4 + the static triage-bed binary, for
#                      the WAN gateways: bed tooling stays out of the
#                      production image (H5: H4 + the binary)
#
# It writes TRIAGE_IMAGE, TRIAGE_BED_IMAGE, TRIAGE_MARIADB_IMAGE and
# TRIAGE_PROMETHEUS_IMAGE to ENV_FILE (default deploy/compose/.images.env),
# which docker-compose --env-file reads. Needs root for debootstrap
# (installed with apt-get when missing).
#
# Runs take turns (a lock): a second one waits for the first and then finds
# its images instead of building them again beside it. .ci/run starts one
# in the background at its beginning, so that debootstrap (the network and
# the disk) and the static build overlap the checks and the tests, and
# TestCompose's up.sh finds the images made or waits for them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
env_file=${1:-$here/.images.env}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
start=$(date +%s.%N)
say() { awk -v s="$start" -v n="$(date +%s.%N)" -v m="$*" 'BEGIN { printf "[%5.1fs] %s\n", n - s, m }'; }
hash() { cat "$@" | sha256sum | cut -c1-12; }
# quiet runs a command and shows its output only when it fails (docker
# build prints the legacy builder's deprecation notice every time).
quiet() { local out; out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

# The static binary builds in the background while the root file system
# is made: debootstrap mostly waits for the network and the disk, the Go
# build for the CPU. On a cold machine this saves a minute or two.
ctx=$(mktemp -d /tmp/triage-image.XXXXXX)
tmp= gobuild=
cleanup() { [ -z "$gobuild" ] || kill "$gobuild" 2>/dev/null || true; rm -rf "$ctx" ${tmp:+"$tmp"}; }
trap cleanup EXIT
say "go build (CGO_ENABLED=0, static), in the background"
# Both binaries: triage runs every role; triage-bed runs the WAN gateways
# (a simulated WAN is test-bed code the production binary does not link).
(CGO_ENABLED=0 go build -C "$root" -trimpath -buildvcs=false -ldflags='-s -w' -o "$ctx/triage" ./cmd/triage &&
  CGO_ENABLED=0 go build -C "$root" -trimpath -buildvcs=false -ldflags='-s -w' -o "$ctx/triage-bed" ./cmd/triage-bed) \
  >"$ctx/build.log" 2>&1 &
gobuild=$!
exec 9>"${TMPDIR:-/tmp}/triage-build-images.lock"
if ! flock -n 9; then
  say "waiting for another build-images.sh to finish"
  flock 9
fi

# 1. The Debian root file system.
h1=$(hash "$here/mariadb/rootfs.sh" "$here/mariadb/packages.txt")
rootfs=triage-rootfs:$h1
if have "$rootfs"; then
  say "$rootfs cached"
else
  if ! command -v debootstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "debootstrap is missing: apt-get install debootstrap (as root)" >&2; exit 1; }
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
  fi
  [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
  tmp=$(mktemp -d /tmp/triage-rootfs.XXXXXX)
  say "debootstrap --variant=minbase bookworm + $(grep -v '^#' "$here/mariadb/packages.txt" | xargs) (about 30-60 s)"
  "$here/mariadb/rootfs.sh" "$tmp/root" "$here/mariadb/packages.txt" "$mirror"
  say "docker import -> $rootfs ($(du -sh "$tmp/root" | cut -f1))"
  tar -C "$tmp/root" -c . | docker import -m "triage compose bed rootfs $h1" - "$rootfs" >/dev/null
  rm -rf "$tmp"
  tmp=
fi

# 2. MariaDB: the root file system plus the entrypoint.
h2=$(echo "$h1" | cat - "$here/mariadb/Dockerfile" "$here/mariadb/entrypoint.sh" | sha256sum | cut -c1-12)
mariadb=triage-mariadb:$h2
if have "$mariadb"; then
  say "$mariadb cached"
else
  say "docker build -> $mariadb"
  quiet docker build -q --build-arg BASE="$rootfs" -t "$mariadb" "$here/mariadb"
fi

# 3. Prometheus: the root file system (Debian's prometheus package) run as
# its own user; the bed mounts its config and alert rules.
h3=$(echo "$h1" | cat - "$here/prometheus/Dockerfile" | sha256sum | cut -c1-12)
prometheus=triage-prometheus:$h3
if have "$prometheus"; then
  say "$prometheus cached"
else
  say "docker build -> $prometheus"
  quiet docker build -q --build-arg BASE="$rootfs" -t "$prometheus" "$here/prometheus"
fi

# 4. Triage: the production image, FROM scratch, and the bed tools on it.
if ! wait "$gobuild"; then
  gobuild=
  cat "$ctx/build.log" >&2
  exit 1
fi
gobuild=
rm -f "$ctx/build.log"
say "go build done"
triage=$("$root/deploy/image/build.sh" "$ctx/triage" 2>"$ctx/image.log") || { cat "$ctx/image.log" >&2; exit 1; }
while read -r line; do say "$line"; done <"$ctx/image.log"
h5=$(echo "$triage" | cat - "$ctx/triage-bed" | sha256sum | cut -c1-12)
bed=triage-bed:$h5
if have "$bed"; then
  say "$bed cached"
else
  mkdir "$ctx/bed"
  mv "$ctx/triage-bed" "$ctx/bed/"
  cat >"$ctx/bed/Dockerfile" <<DOCKERFILE
FROM $triage
COPY triage-bed /triage-bed
ENTRYPOINT ["/triage-bed"]
DOCKERFILE
  say "docker build -> $bed"
  quiet docker build -q -t "$bed" "$ctx/bed"
fi
printf 'TRIAGE_IMAGE=%s\nTRIAGE_BED_IMAGE=%s\nTRIAGE_MARIADB_IMAGE=%s\nTRIAGE_PROMETHEUS_IMAGE=%s\n' \
  "$triage" "$bed" "$mariadb" "$prometheus" >"$env_file"
say "images ready: $triage $bed $mariadb $prometheus (written to $env_file)"
