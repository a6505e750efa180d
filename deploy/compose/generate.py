#!/usr/bin/env python3
"""Writes docker-compose.yml and config/ of the compose bed (deploy/compose).

The files it writes are committed; edit this script, not them, and run it
again (python3 deploy/compose/generate.py). It follows deploy/bed's layout:
shard i+1 has its home (primary) in region i and a replica in each other
region, the next region's first; server_id is the shard for a primary and
k*1000+shard for its k-th replica (deploy/bed serverID).
"""
import json, os
regions = ["us-east", "eu-west", "ap-south"]
out = os.path.dirname(os.path.abspath(__file__))
os.makedirs(out + "/config", exist_ok=True)
# shards: shard i+1 home regions[i]; replica k in regions[(i+k)%3], server id k*1000+shard (deploy/bed serverID)
servers = []  # (service, shard, region, role, server_id)
shards = []
for i, home in enumerate(regions):
    sid = i + 1
    prim = f"mariadb-s{sid}-{home}"
    servers.append((prim, sid, home, "primary", sid))
    reps, repregs = [], []
    for k in range(1, 3):
        r = regions[(i + k) % 3]
        svc = f"mariadb-s{sid}-{r}"
        servers.append((svc, sid, r, "replica", k * 1000 + sid))
        reps.append(svc + ":3306"); repregs.append(r)
    shards.append({"id": sid, "home_region": home, "primary": prim + ":3306", "replicas": reps, "replica_regions": repregs, "database": "triage"})
smap = {"version": 1, "regions": regions, "namespaces": [{"name": "default"}], "shards": shards}
json.dump(smap, open(out + "/config/shardmap.json", "w"), indent=2); open(out + "/config/shardmap.json", "a").write("\n")
boot = {"shard_map_file": "/etc/triage/shardmap.json", "admin": {"user": "root", "password": "root"},
        "nats": [f"nats://nats-{r}:4222" for r in regions], "kv_replicas": 3, "stream_replicas": 3, "owner_ttl": "10s"}
json.dump(boot, open(out + "/config/bootstrap.json", "w"), indent=2); open(out + "/config/bootstrap.json", "a").write("\n")
for r in regions:
    os.makedirs(f"{out}/config/{r}", exist_ok=True)
    via = {f"{s[0]}:3306": f"{s[0]}.lan:3306" for s in servers if s[2] == r}
    for role in ["router", "enqueuer", "dequeuer", "controller"]:
        c = {"region": r, "roles": [role], "nats": f"nats://nats-{r}.lan:4222"}
        if role == "router":
            c["grpc"] = "0.0.0.0:9090"; c["http"] = "0.0.0.0:8080"
        c["mysql"] = {"user": "triage", "password": "triage", "dial_via": via}
        if role == "controller":
            c["admin"] = {"user": "root", "password": "root"}
            c["replication"] = {"User": "repl", "Password": "repl"}
        c["owner_ttl"] = "10s"; c["kv_replicas"] = 3; c["stream_replicas"] = 3
        json.dump(c, open(f"{out}/config/{r}/{role}.json", "w"), indent=2); open(f"{out}/config/{r}/{role}.json", "a").write("\n")

Y = []
w = Y.append
w("""# The multi-region compose bed of Triage: three regions (us-east, eu-west,
# ap-south), one Docker network per region plus "wan" between them. Per
# region: the primary of the region's shard and replicas of the other two
# regions' shards (MariaDB, semi-sync), one NATS server of a three-node
# JetStream cluster, and the Triage roles router, enqueuer, dequeuer and
# controller in containers of their own. See README.md beside this file.
#
# Images come from build-images.sh (no registry): run it, then
#   docker-compose --env-file .images.env -p triage up -d
# or just `make compose-up` at the top of the repository.
#
# Names: every container is reachable as NAME.lan on its region's network
# and as NAME.wan (and NAME) on the WAN. Node configs dial their own
# region's servers by NAME.lan (mysql.dial_via), everything else by NAME,
# which from another region resolves only on the WAN. The WAN adds no
# delay yet (see README.md: this kernel has no sch_netem). The routers'
# JSON gateways and gRPC are published on 127.0.0.1:18080-18082 and
# 19090-19092 (region order); TRIAGE_HTTP_US_EAST, TRIAGE_GRPC_US_EAST ...
# override them (0: a free port, see docker-compose port).
version: "3.9"

x-mariadb: &mariadb
  image: ${TRIAGE_MARIADB_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
  healthcheck:
    test: ["CMD", "mariadb", "-uroot", "--socket=/run/mysqld/mysqld.sock", "-e", "SELECT 1"]
    interval: 1s
    timeout: 5s
    retries: 120
  stop_grace_period: 20s

x-triage: &triage
  image: ${TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
  healthcheck:
    test: ["CMD", "/triage", "probe", "http://127.0.0.1:7070/healthz"]
    interval: 1s
    timeout: 5s
    retries: 120
  depends_on:
    bootstrap:
      condition: service_completed_successfully
  stop_grace_period: 20s

services:""")
def nets(svc, r, extra=""):
    return f"""    networks:
      {r}:
        aliases: [{svc}.lan]
      wan:
        aliases: [{svc}.wan]
"""
netem_targets = []
for svc, sid, r, role, server_id in servers:
    ro = "ON" if role == "replica" else "OFF"
    w(f"""
  # shard {sid}'s server in {r}: {'primary at start' if role == 'primary' else 'replica at start (read-only)'}.
  {svc}:
    <<: *mariadb
    environment:
      SERVER_ID: "{server_id}"
      READ_ONLY: "{ro}"
      ROOT_PASSWORD: root
    volumes:
      - {svc}:/var/lib/mysql
""" + nets(svc, r))
    netem_targets.append((svc, "service_healthy"))
for i, r in enumerate(regions):
    svc = f"nats-{r}"
    routes = ",".join(f"nats-route://nats-{o}:6222" for o in regions if o != r)
    w(f"""
  {svc}:
    image: ${{TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}}
    command: ["nats", "--name", "{svc}", "--store", "/data/nats", "--tags", "region:{r}",
              "--cluster-advertise", "{svc}:6222", "--routes", "{routes}"]
    healthcheck:
      test: ["CMD", "/triage", "probe", "http://127.0.0.1:8222/healthz"]
      interval: 1s
      timeout: 5s
      retries: 120
    volumes:
      - {svc}:/data
""" + nets(svc, r))
    netem_targets.append((svc, "service_started"))
w("""
  # One-shot: accounts, schema, replication, NATS buckets and the shard map
  # (triage bootstrap, deploy/compose.Bootstrap). The roles start after it.
  bootstrap:
    image: ${TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
    command: ["bootstrap", "--config", "/etc/triage/bootstrap.json"]
    volumes:
      - ./config/bootstrap.json:/etc/triage/bootstrap.json:ro
      - ./config/shardmap.json:/etc/triage/shardmap.json:ro
    networks: [wan]
    restart: "no"
    depends_on:""")
for svc, *_ in servers:
    w(f"""      {svc}:
        condition: service_healthy""")
for r in regions:
    w(f"""      nats-{r}:
        condition: service_healthy""")
for i, r in enumerate(regions):
    for role in ["router", "enqueuer", "dequeuer", "controller"]:
        svc = f"{role}-{r}"
        ports = ""
        if role == "router":
            ports = f"""    ports:
      - "127.0.0.1:${{TRIAGE_HTTP_{r.upper().replace('-', '_')}:-{18080 + i}}}:8080"
      - "127.0.0.1:${{TRIAGE_GRPC_{r.upper().replace('-', '_')}:-{19090 + i}}}:9090"
"""
        w(f"""
  {svc}:
    <<: *triage
    command: ["serve", "--config", "/etc/triage/{role}.json", "--health", "127.0.0.1:7070"]
    volumes:
      - ./config/{r}/{role}.json:/etc/triage/{role}.json:ro
""" + ports + nets(svc, r))
        netem_targets.append((svc, "service_started"))
w("""
networks:""")
for r in regions + ["wan"]:
    w(f"""  {r}:""")
w("""
volumes:""")
for svc, *_ in servers:
    w(f"  {svc}:")
for r in regions:
    w(f"  nats-{r}:")
open(out + "/docker-compose.yml", "w").write("\n".join(Y) + "\n")
