#!/usr/bin/env bash
# Quickstart 2: set up, then run the whole test suite (quick tests and the real-model tests,
# which are marked `slow`; add -m "not slow" to skip those).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -ra "$@"
