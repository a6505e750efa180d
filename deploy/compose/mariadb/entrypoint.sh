#!/bin/bash
# The MariaDB container's entrypoint: initialise the datadir on first start,
# then exec mariadbd with the flags deploy/mariadb gives every server of the
# local bed (durability, GTID, ROW binlog, small-box tuning) plus the
# multi-region bed's semi-sync settings (deploy/bed semiSyncArgs: AFTER_SYNC,
# no fallback to async, wait with no replica, replica side on).
#
# Environment:
#   SERVER_ID      server_id, distinct per server of a shard (required)
#   READ_ONLY      ON for a server that starts as a replica (default OFF)
#   ROOT_PASSWORD  password of root@'%', the admin account the bootstrap and
#                  the controller log in with from other containers
# Extra arguments are appended to mariadbd's command line, and so are the
# lines of /var/lib/mysql/next-start-args, once: the file is removed as it
# is read. A drill's heal leaves replication.RejoinArgs there (docker cp)
# before it starts a deposed primary, so that crash recovery drops what no
# replica acknowledged and the server comes back read-only, to be rejoined
# as a replica by the controller.
#
# "triage-mariadb init" only initialises the datadir and exits: the image
# build runs it, so the image carries a ready datadir that Docker copies into
# each new named volume, and nine servers do not run mariadb-install-db at
# once on a small machine when the bed starts.
set -euo pipefail
data=/var/lib/mysql/data
mkdir -p /var/lib/mysql/tmp /run/mysqld
if [ ! -d "$data/mysql" ]; then
  rm -rf "$data.init"
  mariadb-install-db --no-defaults --datadir="$data.init" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >/dev/null
  # Bootstrap mode writes no binary log, so the account creates no GTID
  # that replicas would have to share.
  mariadbd --no-defaults --bootstrap --datadir="$data.init" --user=root --log-error=/var/lib/mysql/bootstrap.err <<SQL
FLUSH PRIVILEGES;
CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY '${ROOT_PASSWORD:?ROOT_PASSWORD is required}';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
SQL
  mv "$data.init" "$data"
fi
[ "${1:-}" = init ] && exit 0
: "${SERVER_ID:?SERVER_ID is required}"
once=()
if [ -f /var/lib/mysql/next-start-args ]; then
  mapfile -t once < /var/lib/mysql/next-start-args
  rm -f /var/lib/mysql/next-start-args
  echo "triage-mariadb: this start only: ${once[*]}" >&2
fi
exec mariadbd --no-defaults \
  --datadir="$data" --port=3306 --bind-address=0.0.0.0 \
  --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid \
  --user=root --log-error=/var/lib/mysql/mariadbd.err --tmpdir=/var/lib/mysql/tmp \
  --server-id="$SERVER_ID" \
  --innodb-flush-log-at-trx-commit=1 --sync-binlog=1 \
  --log-bin="$data/binlog" --relay-log="$data/relay-bin" \
  --binlog-format=ROW --gtid-strict-mode=ON --log-slave-updates=ON \
  --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
  --max-connections=1000 --max-allowed-packet=64M --skip-name-resolve \
  --rpl-semi-sync-master-wait-point=AFTER_SYNC \
  --rpl-semi-sync-master-timeout=$((100 * 365 * 24 * 3600 * 1000)) \
  --rpl-semi-sync-master-wait-no-slave=ON \
  --rpl-semi-sync-slave-enabled=ON \
  --read-only="${READ_ONLY:-OFF}" \
  "${once[@]}" "$@"
