#!/usr/bin/env bash
# Quickstart 2: set up, then run the whole test suite (quick tests and the real-model tests,
# which are marked `slow`; add -m "not slow" to skip those). Arguments pass to pytest.
#
# The suite runs as one pytest process per test folder (tests/decoding, tests/eval, ...): each
# process compiles hundreds of XLA programs, and fresh processes keep memory flat and one
# folder's state out of the next; the folders run in two lanes side by side (below). A run with
# explicit test paths is one pytest process (it stays below the kernel's memory-map limit:
# tests/conftest.py frees jax's cached programs past half of vm.max_map_count, see
# dsbd_jax/decoding/compiles.py). Each lane's output reaches the terminal as it happens,
# every line prefixed by its lane ("[A] "), with a line per finished folder (its result and
# seconds); the last line sums the folders: "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
PY=.venv/bin/python
for a in "$@"; do
  case "$a" in tests*|*.py|*::*) exec "$PY" -m pytest -q -ra "$@";; esac
done
# The lanes (scripts/lanes.sh): each lane's lines stream to the terminal prefixed by the lane
# ("[A] "), one line per finished test and per finished folder (result and seconds).
PY="$PY" exec bash scripts/lanes.sh "$@"
