#!/usr/bin/env bash
# Builds a fresh virtualenv (sdks/python/.venv, ignored by git), installs the SDK with its test
# extras, type-checks it and runs the test suite against the real services (PostgreSQL on
# 127.0.0.1:5432 as postgres, RabbitMQ on 127.0.0.1:5672 as guest/guest; override with
# CHIME_TEST_PG_ADMIN_URL / CHIME_TEST_AMQP_URL), then the conformance suite against the SDK's
# conformance worker. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "ci.sh: $PYTHON is older than 3.11; set PYTHON=python3.11 (or newer)" >&2; exit 1; }
rm -rf .venv
"$PYTHON" -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet ".[test]"
.venv/bin/mypy
conformance=1
if [ "${1:-}" = "--no-conformance" ]; then
  conformance=0
  shift
fi
# The installed package is tested, not the source tree.
.venv/bin/pytest -q -p no:cacheprovider "$@"
# The conformance suite (docs/conformance.md) against this SDK's conformance worker, with the
# suite built from this checkout; --no-conformance (first argument) skips it for a Python-only
# edit loop.
if [ "$conformance" = 1 ]; then
  cargo run --locked -q -p chime-e2e --bin chime-conformance -- \
    --name python --parallel 2 --worker "$PWD/.venv/bin/python -m chime_worker.conformance"
fi
