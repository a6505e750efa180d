#!/bin/bash
# build.sh [BINARY] — builds the production image of Triage (`make image`)
# from the Dockerfile beside this file: FROM scratch, the static triage
# binary, CA certificates and user triage (uid 65532). It is tagged
# triage:HASH, a content hash of its whole build context, and skipped when
# that tag exists, as the compose bed's images are. The tag goes to
# stdout and the progress to stderr, so build-images.sh can run the
# compose bed on the very image this makes.
#
# BINARY is a static triage binary built already (build-images.sh builds
# it while debootstrap runs); without it this builds one. The CA
# certificates are CA_CERTS (default the host's
# /etc/ssl/certs/ca-certificates.crt, Debian's ca-certificates): with no
# registry there is no base image to take them from. Needs no root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ca=${CA_CERTS:-/etc/ssl/certs/ca-certificates.crt}
if [ ! -r "$ca" ]; then
  echo "build.sh: no CA certificates at $ca: apt-get install ca-certificates, or set CA_CERTS" >&2
  exit 1
fi
ctx=$(mktemp -d /tmp/triage-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
if [ $# -gt 0 ]; then
  cp "$1" "$ctx/triage"
else
  # Static (no libc in the image) and without the checkout's VCS stamp:
  # the same source gives the same binary, and so the cached image.
  echo "go build ./cmd/triage (CGO_ENABLED=0, static)" >&2
  CGO_ENABLED=0 go build -C "$root" -trimpath -buildvcs=false -ldflags='-s -w' -o "$ctx/triage" ./cmd/triage
fi
cp "$here/Dockerfile" "$here/passwd" "$here/group" "$ctx/"
cp "$ca" "$ctx/ca-certificates.crt"
mkdir "$ctx/data"
tag=triage:$(cd "$ctx" && cat Dockerfile passwd group ca-certificates.crt triage | sha256sum | cut -c1-12)
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag cached" >&2
else
  # docker build prints the legacy builder's deprecation notice every
  # time: show its output only when it fails.
  out=$(docker build -q -t "$tag" "$ctx" 2>&1) || { echo "$out" >&2; exit 1; }
  echo "docker build -> $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{ printf "%.1f MB", $1 / 1e6 }'))" >&2
fi
echo "$tag"
