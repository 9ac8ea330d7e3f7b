#!/usr/bin/env bash
# Makes sure the local PostgreSQL (127.0.0.1:5432, user postgres, trust auth, a `test` database)
# and RabbitMQ (127.0.0.1:5672, guest/guest) that Chime's quick start and tests use are
# installed and running. Missing ones are installed from the distribution's packages on
# Debian/Ubuntu as root, configured for those defaults, and started; elsewhere the script prints
# the exact commands (or use deploy/compose.yaml) and stops. Services that are down are started.
#
# CHIME_SERVICES_DRY_RUN=1 prints what would be installed or configured, and changes nothing.
set -euo pipefail

dry_run="${CHIME_SERVICES_DRY_RUN:-0}"

wait_until() { # seconds, description, command...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq "$((seconds * 5))"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "error: $what did not come up within ${seconds}s" >&2; return 1
}

# Runs a command that changes the machine, or only prints it under CHIME_SERVICES_DRY_RUN=1.
change() {
  if [ "$dry_run" = 1 ]; then echo "would run: $*"; else "$@"; fi
}

# The newest installed PostgreSQL cluster's version, or nothing.
pg_version() {
  ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1
}

can_install() {
  [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null
}

missing=()
[ -n "$(pg_version)" ] && command -v pg_ctlcluster >/dev/null || missing+=(postgresql)
command -v rabbitmq-server >/dev/null && command -v rabbitmqctl >/dev/null \
  || missing+=(rabbitmq-server)

installed_pg=0
if [ "${#missing[@]}" -gt 0 ]; then
  if ! can_install; then
    cat >&2 <<EOF
error: not installed: ${missing[*]}. Install them, then run this again. On Debian or Ubuntu:

  sudo apt-get update
  sudo apt-get install -y ${missing[*]}

On another system, install PostgreSQL (15 or newer) and RabbitMQ (3.10 or newer) from its
packages, with PostgreSQL trusting user postgres on 127.0.0.1 and a database named test.

To try Chime without installing them, run the whole stack in containers (Docker or Podman):

  docker compose -f deploy/compose.yaml up
EOF
    exit 1
  fi
  echo "== installing ${missing[*]} (the distribution's packages)"
  change apt-get update -q
  change env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  [[ " ${missing[*]} " == *" postgresql "* ]] && installed_pg=1
fi

if [ "$installed_pg" = 1 ] && [ "$dry_run" != 1 ]; then
  # Configure the new cluster for the defaults: trust the local `postgres` user over TCP on
  # 127.0.0.1 (a development machine's setting; docs/operations.md covers production
  # authentication). Rules are matched in order, so the trust line goes first. The package
  # listens on localhost already.
  hba="/etc/postgresql/$(pg_version)/main/pg_hba.conf"
  echo "== configuring PostgreSQL: trust for user postgres on 127.0.0.1 ($hba)"
  if ! grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
    sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
  fi
  # The package may have started the cluster already; a running one re-reads pg_hba.conf.
  pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" main reload 2>/dev/null || true
elif [ "$installed_pg" = 1 ]; then
  echo "would configure: PostgreSQL pg_hba.conf, first line 'host all postgres 127.0.0.1/32 trust'"
fi

if [ "$dry_run" = 1 ] && [ "${#missing[@]}" -gt 0 ]; then
  echo "would start: ${missing[*]}, then create the database test"
  exit 0
fi

if pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "PostgreSQL: running"
else
  echo "PostgreSQL: down, starting it"
  change pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" main start
  [ "$dry_run" = 1 ] || wait_until 60 PostgreSQL pg_isready -h 127.0.0.1 -p 5432 -q
fi

if rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; then
  echo "RabbitMQ: running"
else
  # A node that is still booting (recovering many queues) answers late: only start one if no
  # RabbitMQ node process exists, then wait for it to finish booting.
  if pgrep -f 'beam.smp.*rabbit' >/dev/null; then
    echo "RabbitMQ: starting up, waiting for it"
  else
    echo "RabbitMQ: down, starting it"
    change rabbitmq-server -detached
  fi
  [ "$dry_run" = 1 ] || wait_until 900 RabbitMQ rabbitmqctl -q await_startup --timeout 10
fi
[ "$dry_run" = 1 ] && exit 0

# The tests' databases are made from `test` (DATABASE_URL in .cargo/config.toml); the quick
# start's `chime migrate` creates its own.
if ! psql -h 127.0.0.1 -U postgres -d postgres -w -Atqc 'SELECT 1' >/dev/null 2>&1; then
  cat >&2 <<EOF
error: PostgreSQL on 127.0.0.1:5432 refuses user postgres without a password. Chime's tests and
quick start expect trust for it on 127.0.0.1 (a development machine's setting): add this line
first in pg_hba.conf and reload (sudo pg_ctlcluster $(pg_version) main reload), or set
DATABASE_URL and CHIME_DATABASE_URL to URLs with a password:

  host all postgres 127.0.0.1/32 trust
EOF
  exit 1
fi
if [ -z "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc \
  "SELECT 1 FROM pg_database WHERE datname = 'test'")" ]; then
  echo "PostgreSQL: creating the database test"
  psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test'
fi
