#!/usr/bin/env bash
# The documentation site (mkdocs.yml, MkDocs Material + mkdocstrings).
#
#   bash scripts/docs.sh [build]        build it into site/ with --strict: a broken link or anchor,
#                                       a page missing from the nav or a docstring mkdocstrings
#                                       cannot render fails the build, and so does a private
#                                       (_name) parameter in an API signature
#   bash scripts/docs.sh serve [ARGS]   preview it on http://127.0.0.1:8000/en/latest/, rebuilt on save
#
# Sets up .venv-docs (".[docs]" on Python 3.13, else 3.11), reinstalled only when pyproject.toml
# changes (see scripts/_python.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_python.sh
source scripts/_python.sh

action=${1:-build}
[ $# -gt 0 ] && shift
case $action in
  build | serve) ;;
  *)
    printf 'usage: bash scripts/docs.sh [build|serve] [MKDOCS ARGS...]\n' >&2
    exit 2
    ;;
esac

python=$(find_python 3.13 2>/dev/null || find_python 3.11)
ensure_venv .venv-docs "$python" docs
# Material's banner about its successor says nothing about this site.
export NO_MKDOCS_2_WARNING=1
_log "mkdocs $action --strict"
if [ "$action" = serve ]; then
  exec "$(venv_python .venv-docs)" -m mkdocs serve --strict "$@"
fi
"$(venv_python .venv-docs)" -m mkdocs build --strict "$@"
# the API reference shows no private (_name) parameter in a signature
_log "checking the API reference's signatures"
"$(venv_python .venv-docs)" scripts/check_api_signatures.py site
