#!/usr/bin/env bash
# The test suite: lint, type-check, lint the CI workflows and shell scripts, then pytest on
# Python 3.13 and again on Python 3.11.
#
#   bash scripts/test.sh [PYTEST ARGS...]
#
# Sets up .venv-3.13 (".[embedded,dev]": the dev server's mongoeco needs 3.13) and .venv-3.11
# (".[dev]", our oldest supported Python), reinstalling only when pyproject.toml changed. The 3.11
# run still starts its dev server under 3.13 through MIGRONAUT_DEVSERVER_PYTHON and skips what
# the 3.13 run already covered whatever the client's Python: the long real-process scenarios
# (markers slow, one_interpreter), the dev server's own tests, packaging and the junk sweep
# (tests/conftest.py: ONE_INTERPRETER_MODULES). With
# MIGRONAUT_TEST_URI set, both runs use that MongoDB instead of a dev server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_python.sh
source scripts/_python.sh

# The dashboard's browser tests drive Debian's headless Chromium (tests/test_dashboard_browser.py);
# install it when missing and we may (root, apt-get present). Without it those tests skip, or
# fail under MIGRONAUT_TEST_REQUIRE_TOOLS.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    _log "apt-get install chromium chromium-driver (browser tests)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -q chromium chromium-driver >/dev/null; } \
      || _log "could not install chromium: the browser tests will skip (or fail in CI)"
  fi
fi

py313=$(find_python 3.13)
py311=$(find_python 3.11)
ensure_venv .venv-3.13 "$py313" embedded,dev
ensure_venv .venv-3.11 "$py311" dev
v313=$(venv_python .venv-3.13)
v311=$(venv_python .venv-3.11)

lint_paths=(src tests)
[ -d bench ] && lint_paths+=(bench)
lint_paths+=(scripts)  # the docs site's MkDocs hook and Griffe extension
_log "ruff check ${lint_paths[*]}"
"$v313" -m ruff check "${lint_paths[@]}"
_log "mypy"
"$v313" -m mypy
# the workflows (.github/workflows: ci.yml, release.yml), their `run:` scripts through shellcheck,
# and the shell scripts themselves; both binaries come with the dev extra
bin313="$PWD/$(dirname "$v313")"
_log "actionlint; shellcheck scripts/*.sh .ci/run"
PATH="$bin313:$PATH" "$bin313/actionlint"
"$bin313/shellcheck" scripts/*.sh .ci/run

_log "pytest on Python 3.13"
"$v313" -m pytest --durations=25 "$@"
_log "pytest on Python 3.11 (dev server under 3.13)"
# the long real-process scenarios (markers slow, one_interpreter) ran above; this pass skips
# them, so the whole of .ci/run stays under 30 minutes
MIGRONAUT_TEST_SECOND_INTERPRETER=1 MIGRONAUT_DEVSERVER_PYTHON="$PWD/$v313" "$v311" -m pytest "$@"
_log "all checks passed"
