#!/usr/bin/env bash
# Smoke-test a built wheel the way a user gets it: a clean virtual environment, `pip install
# 'migronaut-X.whl[EXTRA]'`, `migronaut --version`, the extra's modules imported, then the
# README's quickstart (init, create, up, status, down, status --check) against the dev server.
#
#   bash scripts/smoke-dist.sh DIST_DIR [EXTRA]
#
# EXTRA is one of pyproject.toml's user extras (embedded, otel, beanie, mongoengine, celery,
# dashboard) or empty for the bare package. The venv uses Python 3.11, the oldest supported
# (MIGRONAUT_SMOKE_PYTHON=3.13 to change it), except for `embedded`, which needs 3.13. The dev
# server of the quickstart comes from the wheel itself: this venv's when EXTRA is `embedded`,
# else a second clean venv with `[embedded]` on 3.13. release.yml runs it for every extra.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_python.sh
source scripts/_python.sh

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  printf 'usage: bash scripts/smoke-dist.sh DIST_DIR [EXTRA]\n' >&2
  exit 2
fi
dist=$(cd "$1" && pwd)
extra=${2:-}
smoke_python=${MIGRONAUT_SMOKE_PYTHON:-3.11}
# the developer's own configuration must not reach the quickstart
while read -r name; do unset "$name"; done < <(compgen -e | grep '^MIGRONAUT_' || true)

# the modules each extra exists for: importing them is the extra's smoke test
case $extra in
  "") modules="migronaut" ;;
  embedded) modules="migronaut.devserver mongoeco" ;;
  otel) modules="opentelemetry.trace opentelemetry.metrics" ;;
  beanie) modules="migronaut.integrations.beanie" ;;
  mongoengine) modules="migronaut.integrations.mongoengine" ;;
  celery) modules="migronaut.celery" ;;
  dashboard) modules="migronaut.dashboard" ;;
  *)
    printf 'error: unknown extra %q (embedded, otel, beanie, mongoengine, celery, dashboard)\n' \
      "$extra" >&2
    exit 2
    ;;
esac

shopt -s nullglob
wheels=("$dist"/migronaut-*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -ne 1 ]; then
  printf 'error: expected one migronaut wheel in %s, found %s\n' "$dist" "${#wheels[@]}" >&2
  exit 1
fi
wheel=${wheels[0]}
version=$(basename "$wheel" | cut -d- -f2)

work=$(mktemp -d)
cleanup() {
  stop_dev_server
  rm -rf "$work"
}
trap cleanup EXIT

# clean_venv DIR PYTHON EXTRA: a fresh venv of PYTHON with the wheel (and EXTRA) installed from
# the package index, never from this source tree
clean_venv() {
  local dir=$1 python=$2 with=$3 spec=$wheel
  [ -n "$with" ] && spec="${wheel}[$with]"
  _log "pip install '$(basename "$spec")' into a clean $("$python" --version) venv"
  "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
}

if [ "$extra" = embedded ]; then
  python=$(find_python 3.13)
else
  python=$(find_python "$smoke_python")
fi
clean_venv "$work/venv" "$python" "$extra"
bin="$work/venv/bin"

_log "migronaut --version"
said=$("$bin/migronaut" --version)
printf '%s\n' "$said"
[ "$said" = "migronaut $version" ] || { _log "expected 'migronaut $version'"; exit 1; }

_log "import $modules"
# shellcheck disable=SC2086 # one argument per module
(cd "$work" && "$bin/python" -c 'import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)' $modules)

server_bin=$bin
if [ "$extra" != embedded ]; then
  clean_venv "$work/server" "$(find_python 3.13)" embedded
  server_bin="$work/server/bin"
fi
_log "the quickstart against the dev server"
start_dev_server "$server_bin/migronaut" "$work"
mkdir "$work/project"
cd "$work/project"
export PATH="$bin:$PATH"
step() { printf '$ %s\n' "$*" >&2; "$@"; }
step migronaut init --uri "$DEV_SERVER_URI" --db app
step migronaut create "add users email index"
shopt -s nullglob
created=(migrations/*_add_users_email_index.py)
shopt -u nullglob
[ ${#created[@]} -eq 1 ] || { _log "create wrote ${#created[@]} migration files"; exit 1; }
cat >"${created[0]}" <<'PY'
"""Add a unique index on users.email."""

def up(ctx):
    ctx.db.users.create_index("email", unique=True, name="email_unique")

def down(ctx):
    ctx.db.users.drop_index("email_unique")
PY
step migronaut up
step migronaut status --check
step migronaut down
set +e
step migronaut status --check
pending=$?
set -e
[ "$pending" -eq 2 ] || { _log "status --check after down exited $pending, not 2"; exit 1; }
step migronaut up
step migronaut status
_log "migronaut $version${extra:+[$extra]} on $("$bin/python" --version): installed, imported, quickstart passed"
