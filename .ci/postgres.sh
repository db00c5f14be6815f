#!/usr/bin/env bash
# Start (or reuse) a throw-away PostgreSQL server on 127.0.0.1 for the parallel-study tests.
#
#   eval "$(.ci/postgres.sh)"     # exports TUNER_TEST_POSTGRES_URL and PGPASSWORD
#
# Installs PostgreSQL with apt-get when no server binaries are found, creates a cluster in
# ${TUNER_PG_DIR:-/tmp/tuner-pg} listening on 127.0.0.1:${TUNER_PG_PORT:-55432} (run as the
# `postgres` user when this script runs as root), and a database `tuner_test` owned by role
# `tuner` with a random password. The URL carries no password: libpq reads PGPASSWORD, which
# is how operators should pass it to `tuner tune --storage` too.
# Only the two export lines go to stdout; everything else goes to stderr.
set -euo pipefail

PGDIR=${TUNER_PG_DIR:-/tmp/tuner-pg}
PORT=${TUNER_PG_PORT:-55432}
DB=tuner_test
ROLE=tuner
log() { echo "[postgres.sh] $*" >&2; }

find_bin() {
  local name=$1 dir
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/$name" ]; then echo "$dir/$name"; return 0; fi
  done
  return 1
}

if ! find_bin initdb >/dev/null || ! find_bin pg_ctl >/dev/null; then
  log "no PostgreSQL server binaries; installing with apt-get"
  if [ "$(id -u)" -ne 0 ]; then log "need root to apt-get install postgresql"; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q postgresql >&2
fi
INITDB=$(find_bin initdb)
PG_CTL=$(find_bin pg_ctl)
PSQL=$(find_bin psql)

# Run a command as the cluster owner: `postgres` when we are root (initdb refuses root).
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

if [ ! -f "$PGDIR/PG_VERSION" ]; then
  log "initialising a cluster in $PGDIR"
  mkdir -p "$PGDIR"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$PGDIR"
  chmod 700 "$PGDIR"
  as_owner "$INITDB" -D "$PGDIR" --auth-local=trust --auth-host=scram-sha-256 \
    -U postgres >"$PGDIR.initdb.log" 2>&1 || { cat "$PGDIR.initdb.log" >&2; exit 1; }
fi

if as_owner "$PG_CTL" -D "$PGDIR" status >/dev/null 2>&1; then
  log "reusing the server already running in $PGDIR"
else
  log "starting the server on 127.0.0.1:$PORT"
  as_owner "$PG_CTL" -D "$PGDIR" -l "$PGDIR/server.log" -w -t 60 \
    -o "-p $PORT -c listen_addresses=127.0.0.1 -k $PGDIR" start >&2
fi

# The password lives only in the cluster directory (mode 600), so a rerun can reuse it.
PWFILE="$PGDIR/tuner-password"
if [ ! -s "$PWFILE" ]; then
  head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$PWFILE.new"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$PWFILE.new"
  chmod 600 "$PWFILE.new"
  mv "$PWFILE.new" "$PWFILE"
fi
PASSWORD=$(cat "$PWFILE")

psql_owner() { as_owner "$PSQL" -h "$PGDIR" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
if [ "$(psql_owner -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != "1" ]; then
  psql_owner -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'" >&2
else
  psql_owner -c "ALTER ROLE $ROLE PASSWORD '$PASSWORD'" >&2
fi
if [ "$(psql_owner -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]; then
  psql_owner -c "CREATE DATABASE $DB OWNER $ROLE" >&2
fi

# Check the way the tests connect: TCP, password from PGPASSWORD.
PGPASSWORD=$PASSWORD "$PSQL" "postgresql://$ROLE@127.0.0.1:$PORT/$DB" -qtAc "SELECT 1" >/dev/null
log "ready: postgresql://$ROLE@127.0.0.1:$PORT/$DB (password in PGPASSWORD)"
echo "export TUNER_TEST_POSTGRES_URL=postgresql://$ROLE@127.0.0.1:$PORT/$DB"
echo "export PGPASSWORD=$PASSWORD"
