#!/bin/bash
# down.sh — removes the compose bed: containers, networks and volumes of
# project COMPOSE_PROJECT_NAME (default triage), giving each container
# DOWN_TIMEOUT seconds (default 10) to stop. `make compose-down` runs it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
project=${COMPOSE_PROJECT_NAME:-triage}
env_file=${IMAGES_ENV:-$here/.images.env}
if [ ! -f "$env_file" ]; then
  # down needs no image, but the file's ${VAR:?} references must resolve.
  env_file=$(mktemp)
  trap 'rm -f "$env_file"' EXIT
  printf 'TRIAGE_IMAGE=none\nTRIAGE_MARIADB_IMAGE=none\n' >"$env_file"
fi
docker-compose -f "$here/docker-compose.yml" --env-file "$env_file" -p "$project" \
  down --volumes --remove-orphans --timeout "${DOWN_TIMEOUT:-10}"
