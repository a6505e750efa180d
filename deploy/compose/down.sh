#!/bin/bash
# down.sh — removes the compose bed of project COMPOSE_PROJECT_NAME (default
# triage): every container, network and volume docker-compose labelled
# with the project. Containers are killed, not stopped: their volumes go
# too, so there is nothing to shut down cleanly for, and docker-compose
# down took over a minute on a loaded 2-core box. Killing every container
# before removing any keeps Docker from leaving a network endpoint behind
# (seen once with docker rm -f of them all: "has active endpoints"). It
# tries every step and exits 1 if anything is left. `make compose-down`
# runs it.
set -uo pipefail
project=${COMPOSE_PROJECT_NAME:-triage}
label=label=com.docker.compose.project=$project
start=$(date +%s.%N)
ok=true
step() { "$@" >/dev/null || ok=false; }
running=$(docker ps -q --filter "$label")
if [ -n "$running" ]; then
  docker kill $running >/dev/null 2>&1 || true # some may have exited meanwhile
  docker wait $running >/dev/null 2>&1 || true
fi
containers=$(docker ps -aq --filter "$label")
[ -z "$containers" ] || step docker rm --volumes $containers
for n in $(docker network ls -q --filter "$label"); do
  for try in 1 2 3 4 5 6 7 8 9 10; do
    docker network rm "$n" >/dev/null 2>&1 && break
    if [ "$try" = 10 ]; then
      docker network rm "$n" >/dev/null || true
      ok=false
    fi
    sleep 1
  done
done
volumes=$(docker volume ls -q --filter "$label")
[ -z "$volumes" ] || step docker volume rm $volumes
left=$(docker ps -aq --filter "$label"; docker network ls -q --filter "$label"; docker volume ls -q --filter "$label")
awk -v s="$start" -v n="$(date +%s.%N)" -v p="$project" -v c="$(wc -w <<<"$containers")" -v v="$(wc -w <<<"$volumes")" \
  'BEGIN { printf "compose bed %s removed in %.1fs: %d containers, its networks, %d volumes\n", p, n - s, c, v }'
if [ -n "$left" ] || ! $ok; then
  echo "left behind: $(tr '\n' ' ' <<<"$left")" >&2
  exit 1
fi
