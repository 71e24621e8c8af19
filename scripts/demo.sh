#!/usr/bin/env bash
# The demo: a real migronaut project run against the embedded dev server.
#
#   bash scripts/demo.sh
#
# Sets up .venv-3.13 (shared with scripts/test.sh), copies examples/demo to a temporary folder,
# starts `migronaut dev-server` (in memory) unless MIGRONAUT_URI points at a MongoDB, then applies
# the migrations (the last one registers a background migration), runs the background migration
# with two lanes, shows the statuses, rolls the newest migration back (which reverts the
# background migration's documents), shows the status again, the recorded runs (`logs`) and the
# health checks (`audit`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_python.sh
source scripts/_python.sh

ensure_venv .venv-3.13 "$(find_python 3.13)" embedded,dev
bin="$PWD/.venv-3.13/bin"
work=$(mktemp -d)
cleanup() {
  stop_dev_server
  rm -rf "$work"
}
trap cleanup EXIT
cp -r examples/demo/. "$work/"

if [ -z "${MIGRONAUT_URI:-}" ]; then
  _log "starting the embedded dev server"
  start_dev_server "$bin/migronaut" "$work"
  export MIGRONAUT_URI=$DEV_SERVER_URI
fi
export MIGRONAUT_DB="${MIGRONAUT_DB:-migronaut_demo}"
cd "$work"
export PATH="$bin:$PATH"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
step migronaut status
step migronaut up
step migronaut background run 20260101090500_orders_total_cents.py --concurrency 2
step migronaut background status
step migronaut status
step migronaut down --steps 1
step migronaut background run 20260101090500_orders_total_cents.py
step migronaut status
step migronaut dry-run up
step migronaut logs --limit 5
step migronaut audit
