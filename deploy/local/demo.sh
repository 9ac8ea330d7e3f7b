#!/usr/bin/env bash
# Quick start: migrate a `chime` database, start a scheduler with the example jobs and an example
# worker, trigger a manual job, and show runs arriving. Stops both on exit (Ctrl-C or after
# DEMO_SECONDS, default 20).
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/local/services.sh
export CHIME_DATABASE_URL="${CHIME_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/chime}"
export CHIME_AMQP_URL="${CHIME_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
seconds="${DEMO_SECONDS:-20}"

echo "== building"
cargo build --quiet -p chime-scheduler --bin chime
cargo build --quiet -p chime-worker --example example_worker
chime=target/debug/chime

echo "== migrating $CHIME_DATABASE_URL"
"$chime" migrate
echo "== checking the example jobs"
"$chime" check deploy/examples/jobs.toml deploy/local/demo-jobs.toml

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

echo "== starting a scheduler and an example worker (logs in target/demo-*.log)"
"$chime" scheduler --jobs deploy/examples/jobs.toml --jobs deploy/local/demo-jobs.toml \
  >target/demo-scheduler.log 2>&1 &
pids+=($!)
target/debug/examples/example_worker examples >target/demo-worker.log 2>&1 &
pids+=($!)

sleep 3
"$chime" jobs list
echo "== triggering reindex-products by hand"
"$chime" jobs trigger reindex-products --params '{"full": false, "shards": [1]}'

end=$((SECONDS + seconds))
while [ "$SECONDS" -lt "$end" ]; do
  sleep 5
  echo "== latest runs ($(date +%T))"
  "$chime" runs list --limit 8
done
last=$("$chime" runs list --job heartbeat --state succeeded --limit 1 --output json |
  sed -n 's/^    "id": \([0-9]*\),$/\1/p' | head -n 1)
if [ -n "$last" ]; then
  echo "== one run in detail"
  "$chime" runs show "$last"
fi
