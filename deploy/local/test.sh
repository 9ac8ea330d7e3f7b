#!/usr/bin/env bash
# README's test command: makes sure the services are installed and running
# (deploy/local/services.sh), installs what the browser and Python tests need when missing
# (Debian/Ubuntu as root; otherwise prints the commands), then runs every Rust test and the Python
# SDK's suite. Extra arguments go to `cargo test` (a filter, say).
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/local/services.sh

can_install() {
  [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null
}

# What is missing, as Debian packages: headless Chromium and its driver for the dashboard's
# browser test, venv support for the Python SDK's virtualenv.
packages=()
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || packages+=(chromium chromium-driver)
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
if [ "${#packages[@]}" -gt 0 ]; then
  if ! can_install; then
    echo "error: missing: ${packages[*]}. On Debian or Ubuntu:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${packages[*]}" >&2
    exit 1
  fi
  echo "== installing ${packages[*]}"
  # A stale package index would name versions the mirror no longer has.
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}"
fi
command -v cargo >/dev/null || {
  echo "error: no cargo; install Rust with https://rustup.rs (rust-toolchain.toml pins the version)" >&2
  exit 1
}

echo "== Rust tests"
cargo test --workspace --locked "$@"
echo "== Python SDK tests"
bash sdks/python/ci.sh
