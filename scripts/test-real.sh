#!/usr/bin/env bash
# The test suite against a real MongoDB replica set of three members, started for the run in a
# temporary directory and stopped (and removed) on any exit.
#
#   bash scripts/test-real.sh [PYTEST ARGS...]
#
# Starts the set with the first of these found (MIGRONAUT_REAL_WITH=mongod|docker|npx picks one):
#
#   mongod   three `mongod --replSet` on free ports, data and logs in the temporary directory
#   docker   the same three processes in one container of the official image mongo:VERSION
#   npx      mongodb-runner (npm), which downloads the server binaries of VERSION
#
# VERSION is MIGRONAUT_REAL_VERSION (default 8.0; the local mongod's own version for `mongod`).
# Every member runs with test commands (the failpoint tests need configureFailPoint). The set is
# initiated, then `bash scripts/test.sh` runs with MIGRONAUT_TEST_URI pointing at it (ruff, mypy,
# actionlint, pytest on 3.13 and 3.11) and MIGRONAUT_TEST_TOPOLOGY=replica_set, so every test
# that needs a replica set runs instead of skipping. The sharded cluster runs in CI
# (.github/workflows/ci.yml); see docs/contributing.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_python.sh
source scripts/_python.sh

version=${MIGRONAUT_REAL_VERSION:-8.0}
set_name=rs0
runner=mongodb-runner@6.11.1

with=${MIGRONAUT_REAL_WITH:-}
if [ -z "$with" ]; then
  if command -v mongod >/dev/null 2>&1; then
    with=mongod
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    with=docker
  elif command -v npx >/dev/null 2>&1; then
    with=npx
  else
    cat >&2 <<'EOF'
error: no way to start a MongoDB replica set here: none of `mongod` (MongoDB's server, on PATH),
a running `docker`, or `npx` (Node.js 20+) was found. Install one of them, or run the suite
against a replica set of your own: MIGRONAUT_TEST_URI='mongodb://HOST:PORT/?replicaSet=NAME'
bash scripts/test.sh (see docs/contributing.md).
EOF
    exit 3
  fi
fi
case $with in
  mongod | docker | npx) ;;
  *)
    printf 'error: MIGRONAUT_REAL_WITH=%s: use mongod, docker or npx\n' "$with" >&2
    exit 2
    ;;
esac
command -v "$with" >/dev/null 2>&1 || { printf 'error: %s is not on PATH\n' "$with" >&2; exit 3; }

py313=$(find_python 3.13)
ensure_venv .venv-3.13 "$py313" embedded,dev
python=$(venv_python .venv-3.13)

work=$(mktemp -d "${TMPDIR:-/tmp}/migronaut-real.XXXXXX")
pids=()
container=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  _log "stopping the replica set"
  case $with in
    mongod)
      for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
      for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
      ;;
    docker) [ -z "$container" ] || docker rm -f "$container" >/dev/null 2>&1 || true ;;
    npx) npx --yes "$runner" stop --id migronaut-test --runnerDir "$work/runner" >/dev/null 2>&1 || true ;;
  esac
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# three free TCP ports on 127.0.0.1
mapfile -t ports < <("$python" - <<'EOF'
import socket
probes = [socket.socket() for _ in range(3)]
for probe in probes:
    probe.bind(("127.0.0.1", 0))
print("\n".join(str(probe.getsockname()[1]) for probe in probes))
for probe in probes:
    probe.close()
EOF
)
hosts=$(printf '127.0.0.1:%s,' "${ports[@]}")
hosts=${hosts%,}
server_args=(--replSet "$set_name" --setParameter enableTestCommands=1)

case $with in
  mongod)
    _log "starting three mongod ($(mongod --version | head -n 1)) on ${ports[*]} in $work"
    for port in "${ports[@]}"; do
      mkdir -p "$work/db-$port"
      mongod "${server_args[@]}" --bind_ip 127.0.0.1 --port "$port" --dbpath "$work/db-$port" \
        --logpath "$work/mongod-$port.log" >/dev/null &
      pids+=($!)
    done
    ;;
  docker)
    container="migronaut-test-$$"
    _log "starting mongo:$version with three mongod on ${ports[*]} (container $container)"
    launch=""
    publish=()
    for port in "${ports[@]}"; do
      launch+="mkdir -p /data/$port && mongod ${server_args[*]} --bind_ip_all --port $port"
      launch+=" --dbpath /data/$port --logpath /data/$port.log --fork && "
      publish+=(-p "127.0.0.1:$port:$port")
    done
    docker run -d --rm --name "$container" "${publish[@]}" "mongo:$version" \
      sh -c "${launch}tail -f /dev/null" >/dev/null
    ;;
  npx)
    _log "starting MongoDB $version through $runner (three members) in $work"
    # the primary on the first port: the URI below names it, the driver finds the others
    npx --yes "$runner" start --topology replset --secondaries 2 --version "$version.x" \
      --id migronaut-test --runnerDir "$work/runner" --tmpDir "$work" --logDir "$work" \
      -- --port "${ports[0]}" "${server_args[@]}" >/dev/null
    hosts="127.0.0.1:${ports[0]}"
    ;;
esac

# initiate the set (mongodb-runner did it already) and wait for a primary
"$python" - "$with" "$set_name" "${ports[@]}" <<'EOF'
import sys
import time

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

with_, set_name, *ports = sys.argv[1:]
first = MongoClient(f"mongodb://127.0.0.1:{ports[0]}/?directConnection=true",
                    serverSelectionTimeoutMS=30_000)
deadline = time.monotonic() + 120
problem: object = "no primary yet"
while time.monotonic() < deadline:
    try:
        if with_ != "npx":
            members = [{"_id": i, "host": f"127.0.0.1:{port}", "priority": 2 if i == 0 else 1}
                       for i, port in enumerate(ports)]
            try:
                first.admin.command("replSetInitiate", {"_id": set_name, "members": members})
            except OperationFailure as error:
                if error.code != 23:  # AlreadyInitialized
                    raise
        if first.admin.command("hello").get("isWritablePrimary"):
            break
    except PyMongoError as error:
        problem = error
    time.sleep(1)
else:
    sys.exit(f"the replica set did not elect a primary within 120 s: {problem}")
print(f"==> replica set {set_name} up, primary 127.0.0.1:{ports[0]}, MongoDB "
      f"{first.server_info()['version']}", file=sys.stderr)
EOF

export MIGRONAUT_TEST_URI="mongodb://$hosts/?replicaSet=$set_name"
export MIGRONAUT_TEST_TOPOLOGY=replica_set
_log "MIGRONAUT_TEST_URI=$MIGRONAUT_TEST_URI bash scripts/test.sh $*"
bash scripts/test.sh "$@"
