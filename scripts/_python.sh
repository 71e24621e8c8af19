# shellcheck shell=bash
# Interpreter discovery and virtualenv set-up shared by scripts/test.sh and scripts/demo.sh.
#
# Source it from a script that runs with `set -euo pipefail` and has cd'ed to the repo root.
# Functions:
#   find_python MAJOR.MINOR   print the path of a working interpreter of that version, or fail
#   ensure_venv DIR PYTHON EXTRAS
#                             create DIR as a venv of PYTHON and `pip install -e ".[EXTRAS]"`;
#                             skipped when a stamp in DIR says nothing changed since last time
#                             (pyproject.toml, the extras, the interpreter version)
#   venv_python DIR           print DIR's python
#   start_dev_server MIGRONAUT DIR
#                             start `MIGRONAUT dev-server --port 0` (in memory) in the
#                             background, its output in DIR; sets DEV_SERVER_PID and
#                             DEV_SERVER_URI
#   stop_dev_server           stop that server, if one was started (for an EXIT trap)
#
# Overrides: MIGRONAUT_PYTHON311 / MIGRONAUT_PYTHON313 name an interpreter to use as is;
# MIGRONAUT_FORCE_INSTALL=1 reinstalls even when the stamp matches.

_log() { printf '==> %s\n' "$*" >&2; }

# _python_is VERSION CANDIDATE: true when CANDIDATE runs and is Python VERSION (e.g. 3.13).
_python_is() {
  local want=$1 candidate=$2 got
  got=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || return 1
  [ "$got" = "$want" ]
}

find_python() {
  local want=$1 var candidate root
  var="MIGRONAUT_PYTHON${want//./}"
  local -a candidates=()
  if [ -n "${!var:-}" ]; then
    candidates+=("${!var}")
  fi
  # On PATH first; a pyenv shim for a version that is not selected fails the check, so then try
  # the shim with that version selected, then pyenv's install directory itself.
  candidates+=("python$want" "python3")
  if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root 2>/dev/null || true)
  else
    root=${PYENV_ROOT:-$HOME/.pyenv}
  fi
  local -a installed=()
  if [ -n "$root" ] && [ -d "$root/versions" ]; then
    # newest patch release first
    mapfile -t installed < <(
      find "$root/versions" -maxdepth 3 -path "*/versions/$want*/bin/python$want" 2>/dev/null \
        | sort -rV
    )
  fi
  local version
  for candidate in "${candidates[@]}"; do
    if _python_is "$want" "$candidate"; then
      "$candidate" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  for candidate in "${installed[@]}"; do
    # the shim with that version selected, then the interpreter file itself; either way print
    # the real interpreter so venvs do not depend on PYENV_VERSION
    version=$(basename "$(dirname "$(dirname "$candidate")")")
    if PYENV_VERSION=$version _python_is "$want" "python$want"; then
      PYENV_VERSION=$version "python$want" -c 'import sys; print(sys.executable)'
      return 0
    fi
    if _python_is "$want" "$candidate"; then
      "$candidate" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  # shellcheck disable=SC2016 # the backquotes are literal: a command to type
  printf 'error: no Python %s found (tried %s, pyenv versions under %s); install it (e.g. `pyenv install %s`) or set %s\n' \
    "$want" "${candidates[*]}" "${root:-?}" "$want" "$var" >&2
  return 1
}

venv_python() {
  printf '%s/bin/python\n' "$1"
}

ensure_venv() {
  local dir=$1 python=$2 extras=$3
  local stamp="$dir/.migronaut-install-stamp" want have="" py
  py=$(venv_python "$dir")
  want="$(sha256sum pyproject.toml | cut -d' ' -f1) extras=$extras python=$("$python" -c 'import sys; print(sys.version.split()[0])')"
  if [ -x "$py" ] && "$py" -c 'pass' 2>/dev/null; then
    [ -f "$stamp" ] && have=$(cat "$stamp")
  else
    _log "creating $dir with $python"
    rm -rf "$dir"
    "$python" -m venv "$dir"
  fi
  if [ "$have" = "$want" ] && [ "${MIGRONAUT_FORCE_INSTALL:-0}" != 1 ]; then
    return 0
  fi
  _log "installing .[$extras] into $dir"
  rm -f "$stamp"
  "$py" -m pip install --quiet -e ".[$extras]"
  printf '%s\n' "$want" >"$stamp"
}

start_dev_server() {
  local migronaut=$1 dir=$2
  "$migronaut" dev-server --port 0 >"$dir/.server.out" 2>"$dir/.server.err" &
  DEV_SERVER_PID=$!
  for _ in $(seq 1 100); do
    [ -s "$dir/.server.out" ] && break
    kill -0 "$DEV_SERVER_PID" 2>/dev/null || { cat "$dir/.server.err" >&2; return 1; }
    sleep 0.1
  done
  [ -s "$dir/.server.out" ] || { _log "the dev server printed no URI within 10 s"; return 1; }
  DEV_SERVER_URI=$(head -n 1 "$dir/.server.out")
  export DEV_SERVER_PID DEV_SERVER_URI
}

stop_dev_server() {
  if [ -n "${DEV_SERVER_PID:-}" ]; then
    kill "$DEV_SERVER_PID" 2>/dev/null || true
    wait "$DEV_SERVER_PID" 2>/dev/null || true
    DEV_SERVER_PID=""
  fi
}
