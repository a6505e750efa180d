#!/bin/bash
# up.sh — builds the compose bed's images when their tags are missing
# (build-images.sh), starts the bed with docker-compose, waits until every
# container is healthy and the one-shot bootstrap exited 0, and prints
# each region's gateways and a curl tour. `make compose-up` runs it.
#
# Before the start it makes the bed directory (TRIAGE_BED_DIR, default
# deploy/compose/.bed/PROJECT; go run ./deploy/compose/beddir): the bed's
# API key (token, cluster-admin) and the routers' keys file, random NATS
# passwords, and a throwaway CA with the NATS and MariaDB servers' certificates, which
# the containers mount. A complete directory is kept (the bed may be
# running); down.sh removes it.
#
# Environment: COMPOSE_PROJECT_NAME (default triage), IMAGES_ENV (the env
# file build-images.sh writes; default deploy/compose/.images.env),
# TRIAGE_BED_DIR (see above),
# TRIAGE_HTTP_US_EAST ..., TRIAGE_PROMETHEUS (published ports, see
# docker-compose.yml),
# UP_TIMEOUT seconds (default 300), SPARE_SHARDS (default 0; n adds
# docker-compose.spare.yml, whose n spare shards start and are replicated
# but stay out of the shard map until triage shard add: README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
project=${COMPOSE_PROJECT_NAME:-triage}
env_file=${IMAGES_ENV:-$here/.images.env}
start=$(date +%s.%N)
say() { awk -v s="$start" -v n="$(date +%s.%N)" -v m="$*" 'BEGIN { printf "[%5.1fs] %s\n", n - s, m }'; }
# port SERVICE PORT is the host address docker publishes SERVICE's PORT on
# (docker port: much faster than the Python docker-compose port).
port() {
  local id
  id=$(docker ps -q --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.service=$1")
  docker port "$id" "$2/tcp" | head -1
}
files=(-f "$here/docker-compose.yml")
spare=${SPARE_SHARDS:-0}
if [ "$spare" != 0 ]; then
  # The override holds a fixed set of spares (compose.DefaultTopology):
  # refuse a count it cannot give rather than start a different bed.
  have=$(grep -c 'triage.started-as: "primary"' "$here/docker-compose.spare.yml" 2>/dev/null || true)
  if [ "$spare" != "${have:-0}" ]; then
    echo "SPARE_SHARDS=$spare: docker-compose.spare.yml has ${have:-0} spare shard(s); set SpareShards in" \
      "compose.DefaultTopology (deploy/compose/generate.go) and run go generate ./deploy/compose" >&2
    exit 2
  fi
  files+=(-f "$here/docker-compose.spare.yml")
fi
dc() { docker-compose "${files[@]}" --env-file "$env_file" -p "$project" "$@"; }

bed_dir=${TRIAGE_BED_DIR:-$here/.bed/$project}
mkdir -p "$bed_dir"
bed_dir=$(cd "$bed_dir" && pwd) # docker-compose mounts it: an absolute path
export TRIAGE_BED_DIR=$bed_dir
say "bed directory $bed_dir (API key, NATS passwords and certificates)"
go run -C "$here/../.." ./deploy/compose/beddir "$bed_dir"
"$here/build-images.sh" "$env_file"
[ "$spare" = 0 ] || say "with $spare spare shard(s) of docker-compose.spare.yml (not in the shard map)"
say "docker-compose -p $project up -d (MariaDB and NATS, then bootstrap, then the Triage roles)"
if ! dc up -d 2>&1 | grep -v -e '^Creating' -e '^Starting' >&2; then :; fi
# up -d fails when a depends_on condition fails (e.g. bootstrap exits 1).
say "waiting for every container to be healthy"
deadline=$((SECONDS + ${UP_TIMEOUT:-300}))
while :; do
  status=$(docker ps -a --filter "label=com.docker.compose.project=$project" --format '{{.Names}}|{{.Status}}')
  bad=$(grep -E '\|Exited \([1-9][0-9]*\)|\(unhealthy\)' <<<"$status" || true)
  waiting=$(grep -E '\(health: starting\)|\|Created|\|Restarting' <<<"$status" || true)
  running=$(grep -c '|Up' <<<"$status" || true)
  if [ -n "$bad" ] || [ "$SECONDS" -gt "$deadline" ] || [ "$running" = 0 ]; then
    say "the bed did not come up:"
    echo "$status" | sort | tr '|' '\t' >&2
    for c in $(cut -d'|' -f1 <<<"${bad:-$waiting}"); do
      echo "--- last log lines of $c:" >&2
      docker logs --tail 20 "$c" 2>&1 | sed 's/^/    /' >&2
    done
    echo "make compose-down (or deploy/compose/down.sh) removes it." >&2
    exit 1
  fi
  [ -z "$waiting" ] && break
  sleep 1
done
say "the bed is up: $(wc -l <<<"$status") containers (project $project)"
echo
first=
for r in us-east eu-west ap-south; do
  http=$(port "router-$r" 8080)
  grpc=$(port "router-$r" 9090)
  first=${first:-$http}
  printf '  region %-9s JSON http://%s   gRPC %s\n' "$r" "$http" "$grpc"
done
last=$http
printf '  %-21s http://%s   (/targets; /alerts: deploy/prometheus/alerts.yml)\n' Prometheus "$(port prometheus 9090)"
cat <<TOUR

The routers want the bed's API key (cluster-admin; the triage CLI reads TRIAGE_TOKEN).
NATS (not published; each server on its region's network) wants TLS with $bed_dir/ca.crt
and a login: applications use "client" (password in $bed_dir/nats-client).

Try (namespace "default" exists):
  export TRIAGE_TOKEN=\$(cat $bed_dir/token)
  curl -s -H "authorization: Bearer \$TRIAGE_TOKEN" -H "content-type: application/json" \\
       -X POST http://$first/v1/namespaces/default/topics/emails/items -d '{"items":[{"payload":"aGVsbG8=","priority":1}]}'
  curl -s -H "authorization: Bearer \$TRIAGE_TOKEN" -H "content-type: application/json" \\
       -X POST http://$first/v1/namespaces/default:dequeue -d '{"topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
  # store in eu-west through us-east's router, read it back through ap-south's:
  curl -s -H "authorization: Bearer \$TRIAGE_TOKEN" -H "content-type: application/json" \\
       -X POST http://$first/v1/namespaces/default/topics/emails/items -d '{"region":"eu-west","items":[{"payload":"aGVsbG8="}]}'
  curl -s -H "authorization: Bearer \$TRIAGE_TOKEN" -H "content-type: application/json" \\
       -X POST http://$last/v1/namespaces/default:dequeue -d '{"region":"eu-west","topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
  curl -s -H "authorization: Bearer \$TRIAGE_TOKEN" http://$first/v1/shardmap
  TRIAGE_BED_DIR=$bed_dir docker-compose -p $project ${files[*]} --env-file $env_file ps

"make compose-down" removes every container, network and volume, and the bed directory.
TOUR
if [ "$spare" != 0 ]; then
  # The add commands are the override's header (written by generate.go).
  echo
  echo "Spare shards: started and replicated, not in the shard map. Add them online (README.md, Spare shards):"
  echo "  export TRIAGE_ADDR=$(port router-us-east 9090) TRIAGE_TOKEN=\$(cat $bed_dir/token)"
  awk '/^#   triage shard add/ { p = 1 } /^# and,/ { p = 0 }
       p { sub(/^#   triage/, "  .bin/triage"); sub(/^#     /, "      "); print }' "$here/docker-compose.spare.yml"
fi
