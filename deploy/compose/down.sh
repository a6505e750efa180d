#!/bin/bash
# down.sh — removes the compose bed of project COMPOSE_PROJECT_NAME (default
# triage): every container, network and volume docker-compose labelled
# with the project. Containers are killed, not stopped: their volumes go
# too, so there is nothing to shut down cleanly for, and docker-compose
# down took over a minute on a loaded 2-core box. Killing every container
# before removing any keeps Docker from leaving a network endpoint behind
# (seen once with docker rm -f of them all: "has active endpoints"); an
# endpoint Docker keeps anyway is disconnected by force. It tries every
# step and exits 1 if anything is left. Then it removes the bed directory
# (up.sh's TRIAGE_BED_DIR: the API key, NATS passwords and certificates),
# the one the routers mount, else TRIAGE_BED_DIR or
# deploy/compose/.bed/PROJECT: the files compose.WriteBedDir writes, and
# the directory if that empties it. `make compose-down` runs it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
project=${COMPOSE_PROJECT_NAME:-triage}
label=label=com.docker.compose.project=$project
start=$(date +%s.%N)
ok=true
step() { "$@" >/dev/null || ok=false; }
bed_dir=
for id in $(docker ps -aq --filter "$label" --filter label=triage.role=router); do
  keys=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/etc/triage/keys.json"}}{{.Source}}{{end}}{{end}}' "$id" 2>/dev/null)
  [ -z "$keys" ] || bed_dir=$(dirname "$keys")
done
bed_dir=${bed_dir:-${TRIAGE_BED_DIR:-$here/.bed/$project}}
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
    # Docker can keep the endpoint of a container it has already removed
    # ("has active endpoints" with no container left); a forced disconnect
    # by name drops such a stale endpoint.
    for e in $(docker network inspect -f '{{range .Containers}}{{.Name}} {{end}}' "$n" 2>/dev/null); do
      docker network disconnect -f "$n" "$e" >/dev/null 2>&1 || true
    done
    if [ "$try" = 10 ]; then
      docker network rm "$n" >/dev/null || true
      ok=false
    fi
    sleep 1
  done
done
volumes=$(docker volume ls -q --filter "$label")
[ -z "$volumes" ] || step docker volume rm $volumes
if [ -d "$bed_dir" ]; then
  # compose.bedFiles; TestDownRemovesTheBedDir holds the two lists together.
  for f in keys.json token ca.crt nats-server.crt nats-server.key mysql-server.crt mysql-server.key nats-triage nats-client nats-route; do
    step rm -f "$bed_dir/$f"
  done
  rmdir "$bed_dir" 2>/dev/null || true
  rmdir "$here/.bed" 2>/dev/null || true
fi
left=$(docker ps -aq --filter "$label"; docker network ls -q --filter "$label"; docker volume ls -q --filter "$label")
awk -v s="$start" -v n="$(date +%s.%N)" -v p="$project" -v c="$(wc -w <<<"$containers")" -v v="$(wc -w <<<"$volumes")" \
  'BEGIN { printf "compose bed %s removed in %.1fs: %d containers, its networks, %d volumes\n", p, n - s, c, v }'
if [ -n "$left" ] || ! $ok; then
  echo "left behind: $(tr '\n' ' ' <<<"$left")" >&2
  exit 1
fi
