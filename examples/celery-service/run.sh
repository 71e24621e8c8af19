#!/usr/bin/env bash
# The Celery service example, end to end:
#
#   bash examples/celery-service/run.sh          # deploy, check, stop
#   KEEP=1 bash examples/celery-service/run.sh   # ... and keep serving until Ctrl-C
#
# Starts the embedded dev server (unless MIGRONAUT_URI points at a MongoDB), a Celery worker
# serving both queues with beat (`celery -A migronaut.celery worker -B -P threads`) on the local
# Redis (MIGRONAUT_CELERY_BROKER_URL, default redis://127.0.0.1:6379/0), then the web service,
# which enqueues `up` at deploy and waits for the worker to apply the migrations; finally asks the
# service for /health and /products. PYTHON picks the interpreter (default: python3 with
# migronaut[celery,embedded] installed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# wait_for FILE TEXT PID: until FILE contains TEXT (60 s), or fail when PID died
wait_for() {
  for _ in $(seq 1 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "process $3 exited:" >&2; cat "$1" >&2; exit 1; }
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1:" >&2; cat "$1" >&2; exit 1
}

if [ -z "${MIGRONAUT_URI:-}" ]; then
  say "starting the embedded dev server"
  "$python" -m migronaut dev-server --port 0 >"$work/server.out" 2>"$work/server.err" &
  pids+=($!)
  wait_for "$work/server.out" "mongodb://" "${pids[-1]}"
  MIGRONAUT_URI=$(head -n 1 "$work/server.out")
  export MIGRONAUT_URI
fi
export MIGRONAUT_DB="${MIGRONAUT_DB:-celery_service}"
export MIGRONAUT_CELERY_BROKER_URL="${MIGRONAUT_CELERY_BROKER_URL:-redis://127.0.0.1:6379/0}"
cd "$here"
queue=$("$python" -c 'from migronaut.celery import create_app
app, installed = create_app()
print(installed.settings.queue + "," + installed.settings.background_queue_name)')

say "starting a Celery worker with beat on $queue"
"$python" -m celery -A migronaut.celery worker -B -P threads -c 2 -Q "$queue" \
  -s "$work/beat-schedule" -n "celery-service-$$@%h" --without-gossip --without-mingle \
  -l INFO >"$work/worker.log" 2>&1 &
pids+=($!)
wait_for "$work/worker.log" " ready." "${pids[-1]}"

say "deploying the service (enqueues up, waits for the worker)"
"$python" service.py --port "${PORT:-0}" >"$work/service.log" 2>&1 &
pids+=($!)
wait_for "$work/service.log" "serving on" "${pids[-1]}"
cat "$work/service.log"
url=$(sed -n 's/^serving on //p' "$work/service.log")

say "GET $url/health and $url/products"
"$python" - "$url" <<'PY'
import json, sys, urllib.request
for path in ("/health", "/products"):
    with urllib.request.urlopen(sys.argv[1] + path, timeout=10) as reply:
        print(path, reply.status, json.dumps(json.load(reply)))
PY

if [ -n "${KEEP:-}" ]; then
  say "serving on $url — Ctrl-C to stop (worker log: $work/worker.log)"
  wait "${pids[-1]}"
fi
say "done"
