#!/usr/bin/env bash
# Quickstart 2: set up, then run the whole test suite (quick tests in two lanes, then the
# real-model tests, marked `slow`, alone; add -m "not slow" to skip those). Arguments pass to
# pytest.
#
# The suite runs as one pytest process per test folder (tests/decoding, tests/eval, ...): each
# process compiles hundreds of XLA programs, and fresh processes keep memory flat and one
# folder's state out of the next; the folders run in two lanes side by side (below). A run with
# explicit test paths is one pytest process (it stays below the kernel's memory-map limit:
# tests/conftest.py frees jax's cached programs past half of vm.max_map_count, see
# dsbd_jax/decoding/_jit/compiles.py). Each lane's output reaches the terminal as it happens,
# every line prefixed by its lane ("[A] "), with a line per finished folder (its result and
# seconds); the last line sums the folders: "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
PY=.venv/bin/python
for a in "$@"; do
  case "$a" in tests*|*.py|*::*) exec "$PY" -m pytest -q -ra "$@";; esac
done
# One JAX compilation cache for the whole run, fresh (nothing from an earlier run), shared by
# every process of it: the lanes' pytest processes, the command lines and notebooks they start
# (about three quarters of the suite's time is XLA compiling the same tiny models' programs
# again in each process; a program read back takes milliseconds). The tests keep
# DSBD_JAX_COMPILATION_CACHE=0 (tests/conftest.py): the library's own cache folder and its
# program store stay off, so no test traces or counts differently; compile counts include a
# cache hit (dsbd_jax/decoding/_jit/compiles.py). The tests of the caches make their own folders.
# DSBD_TEST_XLA_CACHE=0 leaves it out.
if [ "${DSBD_TEST_XLA_CACHE:-1}" != 0 ] && [ -z "${JAX_COMPILATION_CACHE_DIR:-}" ]; then
  XLA_CACHE=$(mktemp -d -t dsbd-test-xla-XXXXXX)
  trap 'rm -rf "$XLA_CACHE"' EXIT
  export JAX_COMPILATION_CACHE_DIR="$XLA_CACHE"
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
fi
# The lanes (scripts/lanes.sh): each lane's lines stream to the terminal prefixed by the lane
# ("[A] "), one line per finished test and per finished folder (result and seconds). The docs
# build and its doctests are part of them (tests/test_docs.py).
LOG_LANES=$(mktemp); LOG_SLOW=$(mktemp); LOG_NEWEST=$(mktemp); LOG_NEWEST_SETUP=$(mktemp)
# The newest-JAX lane's environment (a venv, pip downloads: mostly waiting on the network) is
# made in the background while the lanes run; its tests run beside the slow lane (below).
NEWEST=0
if [ "${DSBD_NEWEST_JAX:-1}" != 0 ]; then
  NEWEST=1
  bash scripts/newest_jax.sh --setup-only >"$LOG_NEWEST_SETUP" 2>&1 &
  NEWEST_SETUP_PID=$!
fi
# The real-model tests (marked slow, up to 13 GB each) run after the lanes, so that no other
# lane's process holds its memory beside them (only the newest-JAX lane's tiny models): the
# lanes take -m "not slow", then lane S takes -m slow. An explicit -m in the arguments keeps one
# pass with that selection.
# The tests marked extended (further cells of a matrix, further parametrisations of what a CI
# test covers: pyproject.toml's markers) run only with DSBD_TEST_EXTENDED=1: CI runs the rest,
# within its hour on the slowest 2-core host (the AVX2-only AMD EPYC).
SPLIT=1
for a in "$@"; do case "$a" in -m|-m*) SPLIT=0;; esac; done
if [ "${DSBD_TEST_EXTENDED:-0}" = 1 ]; then
  NOT_EXT=""; ONLY_SLOW="slow"
else
  NOT_EXT=" and not extended"; ONLY_SLOW="slow and not extended"
fi
if [ "$SPLIT" = 1 ]; then
  PY="$PY" bash scripts/lanes.sh -m "not slow$NOT_EXT" "$@" 2>&1 | tee "$LOG_LANES"
  status=${PIPESTATUS[0]}
else
  PY="$PY" bash scripts/lanes.sh "$@" 2>&1 | tee "$LOG_LANES"
  status=${PIPESTATUS[0]}
fi
# Then the newest-JAX lane (scripts/newest_jax.sh: the decoders' exactness tests under the newest
# jax on Python 3.12; skipped, and said so, where no 3.12 interpreter exists; DSBD_NEWEST_JAX=0
# leaves it out) beside the slow lane: its tiny models need little memory next to the real ones.
if [ "$NEWEST" = 1 ]; then
  wait "$NEWEST_SETUP_PID"
  sed -u 's/^/[N] /' "$LOG_NEWEST_SETUP"
  echo "== newest-jax lane (beside the slow lane)"
  (bash scripts/newest_jax.sh 2>&1 | sed -u 's/^/[N] /' | tee "$LOG_NEWEST"
   exit "${PIPESTATUS[0]}") &
  NEWEST_PID=$!
fi
if [ "$SPLIT" = 1 ]; then
  echo "== slow lane: the real-model tests"
  # only the files that mark tests slow (collecting the whole suite to select them took 20-70 s)
  SLOW_FILES=$(grep -rlE "pytest\.mark\.slow" tests --include="test_*.py" | sort | tr '\n' ' ')
  PY="$PY" DSBD_TEST_LANES="${SLOW_FILES:-tests}" DSBD_TEST_LANE_NAMES="S" bash scripts/lanes.sh \
    -m "$ONLY_SLOW" "$@" \
    2>&1 | tee "$LOG_SLOW"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "$NEWEST" = 1 ]; then
  wait "$NEWEST_PID" || status=1
fi
# The end of the output names every failed test again (pytest's "FAILED <id> - <reason>" lines
# of every lane) and the host, so that the tail of a CI log says what failed and where; the
# closing line sums the lanes', the slow lane's and the newest-JAX lane's lines: "N passed,
# N failed, N skipped"
"$PY" scripts/suite_summary.py "$LOG_LANES" "$LOG_SLOW" "$LOG_NEWEST"
rm -f "$LOG_LANES" "$LOG_SLOW" "$LOG_NEWEST" "$LOG_NEWEST_SETUP"
exit $status
