#!/usr/bin/env bash
# Quickstart 2: set up, then run the whole test suite (quick tests and the real-model tests,
# which are marked `slow`; add -m "not slow" to skip those). Arguments pass to pytest.
#
# The suite runs as one pytest process per test folder (tests/decoding, tests/eval, ...): each
# process compiles hundreds of XLA programs, and fresh processes keep memory flat and one
# folder's state out of the next. A run with explicit test paths is one pytest process (it stays
# below the kernel's memory-map limit: tests/conftest.py frees jax's cached programs past half
# of vm.max_map_count, see dsbd_jax/decoding/compiles.py). The
# last line sums the folders: "N passed, N failed[, N skipped]".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
PY=.venv/bin/python
for a in "$@"; do
  case "$a" in tests*|*.py|*::*) exec "$PY" -m pytest -q -ra "$@";; esac
done
LOG=$(mktemp)
status=0
for group in tests/decoding tests/eval tests/models tests/parallel tests/training tests/test_*.py; do
  echo "== pytest $group"
  "$PY" -m pytest -q -ra "$@" $group 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi   # 5: every test deselected
done
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
