#!/usr/bin/env bash
# Build the documentation site into docs/_build/html, with warnings as errors, and run the
# examples of its pages (sphinx.ext.doctest). Installs the docs extra into .venv when Sphinx is
# missing (run scripts/setup.sh first on a fresh clone). About a minute on 2 cores.
#   bash scripts/docs.sh            # html + doctests
#   bash scripts/docs.sh html       # html only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { echo "docs: $PY not found; run bash scripts/setup.sh first" >&2; exit 1; }
if ! "$PY" -c "import sphinx, myst_parser, furo" 2>/dev/null; then
  echo "docs: installing the docs extra into .venv"
  "$PY" -m pip install -q -e ".[docs]"
fi
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
"$PY" -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "docs: html in docs/_build/html/index.html"
if [ "${1:-all}" != "html" ]; then
  "$PY" -m sphinx -W --keep-going -q -b doctest docs docs/_build/doctest
  echo "docs: doctests passed ($(grep -Eo '^ *[0-9]+ tests' docs/_build/doctest/output.txt | tr -s ' ' | head -1 | xargs))"
fi
