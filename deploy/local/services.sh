#!/usr/bin/env bash
# Makes sure the local PostgreSQL (127.0.0.1:5432) and RabbitMQ (127.0.0.1:5672) that Chime's
# quick start and tests use are running, starting whichever is down (Debian service layout).
set -euo pipefail

wait_until() { # seconds, description, command...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq "$((seconds * 5))"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "error: $what did not come up within ${seconds}s" >&2; return 1
}

if pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "PostgreSQL: running"
else
  echo "PostgreSQL: down, starting it"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  wait_until 60 PostgreSQL pg_isready -h 127.0.0.1 -p 5432 -q
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
    rabbitmq-server -detached
  fi
  wait_until 900 RabbitMQ rabbitmqctl -q await_startup --timeout 10
fi
