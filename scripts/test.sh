#!/usr/bin/env bash
# Quickstart 2: set up, then run the whole test suite (quick tests and the real-model tests,
# which are marked `slow`; add -m "not slow" to skip those). Arguments pass to pytest.
#
# The suite runs as one pytest process per test folder (tests/decoding, tests/eval, ...): each
# process compiles hundreds of XLA programs, and fresh processes keep memory flat and one
# folder's state out of the next; the folders run in two lanes side by side (below). A run with
# explicit test paths is one pytest process (it stays below the kernel's memory-map limit:
# tests/conftest.py frees jax's cached programs past half of vm.max_map_count, see
# dsbd_jax/decoding/compiles.py). The last line sums the folders: "N passed, N failed[, N
# skipped]".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
PY=.venv/bin/python
for a in "$@"; do
  case "$a" in tests*|*.py|*::*) exec "$PY" -m pytest -q -ra "$@";; esac
done
# Two lanes run side by side (the suite is mostly single-threaded XLA compilation, and the host
# has 2 cores: about 18 minutes instead of 26 one after the other); each lane runs its folders
# one pytest process after another, and prints its log when it is done.
LOG=$(mktemp)
LANE_A="tests/models tests/parallel tests/training"
LANE_B="tests/decoding tests/eval $(echo tests/test_*.py)"
run_lane() {
  local out=$1; shift
  local rc_all=0
  for group in "$@"; do
    echo "== pytest $group" >>"$out"
    "$PY" -m pytest -q -ra ${EXTRA[@]+"${EXTRA[@]}"} $group >>"$out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then rc_all=1; fi   # 5: every test deselected
  done
  return $rc_all
}
EXTRA=("$@")
A_LOG=$(mktemp); B_LOG=$(mktemp)
echo "== lane A: $LANE_A"
echo "== lane B: $LANE_B"
run_lane "$A_LOG" $LANE_A & A_PID=$!
run_lane "$B_LOG" $LANE_B & B_PID=$!
status=0
wait $A_PID || status=1
cat "$A_LOG"; cat "$A_LOG" >>"$LOG"
wait $B_PID || status=1
cat "$B_LOG"; cat "$B_LOG" >>"$LOG"
"$PY" - "$LOG" <<'PY'
import re, sys
final = re.compile(r"^(\d+ [a-z]+)(, \d+ [a-z]+)* in [0-9.]+s")
counts = {"passed": 0, "failed": 0, "skipped": 0}
for line in open(sys.argv[1], errors="replace"):
    line = line.strip().strip("=").strip()
    if final.match(line):
        for n, what in re.findall(r"(\d+) ([a-z]+)", line.split(" in ")[0]):
            key = "failed" if what in ("failed", "error", "errors") else what
            if key in counts:
                counts[key] += int(n)
print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
PY
exit $status
