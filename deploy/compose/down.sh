#!/bin/bash
# down.sh — removes the compose bed of project COMPOSE_PROJECT_NAME (default
# triage): every container, network and volume docker-compose labelled
# with the project. Containers are killed, not stopped: their volumes go
# too, so there is nothing to shut down cleanly for, and docker-compose
# down took over a minute on a loaded 2-core box. `make compose-down` runs
# it.
set -euo pipefail
project=${COMPOSE_PROJECT_NAME:-triage}
label=label=com.docker.compose.project=$project
start=$(date +%s.%N)
containers=$(docker ps -aq --filter "$label")
[ -z "$containers" ] || docker rm -f --volumes $containers >/dev/null
networks=$(docker network ls -q --filter "$label")
[ -z "$networks" ] || docker network rm $networks >/dev/null
volumes=$(docker volume ls -q --filter "$label")
[ -z "$volumes" ] || docker volume rm $volumes >/dev/null
awk -v s="$start" -v n="$(date +%s.%N)" -v p="$project" -v c="$(wc -w <<<"$containers")" \
  -v w="$(wc -w <<<"$networks")" -v v="$(wc -w <<<"$volumes")" \
  'BEGIN { printf "compose bed %s removed in %.1fs: %d containers, %d networks, %d volumes\n", p, n - s, c, w, v }'
