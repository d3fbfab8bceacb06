#!/usr/bin/env bash
# The lanes of scripts/test.sh (no setup): one pytest process per test folder, the folders in
# lanes side by side, every lane's output streamed to the terminal as it happens, each line
# prefixed by its lane ("[A] ", "[B] ", ...). After each folder a line names it with its result
# and seconds ("[A] == done tests/models: 12 passed, 1 skipped in 30.1s (33 s)"); the last line
# sums the folders: "N passed, N failed, N skipped". Exit status 1 if a folder failed (a pytest
# exit status other than 0 or 5, "every test deselected"), else 0. Arguments pass to every pytest.
#
# Environment: PY (default .venv/bin/python); DSBD_TEST_LANES: the lanes, separated by ";", each
# a space-separated list of folders or files (default: the two lanes below); DSBD_TEST_LANE_NAMES:
# their prefixes (default "A B ..."); DSBD_TEST_LANES_LIST=1: print the lanes and run nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# Two lanes run side by side (the suite is mostly single-threaded XLA compilation, and the host
# has 2 cores); each lane runs its folders one pytest process after another; each prints every
# test phase over 5 s, slowest first, at its end (the figures for choosing what CI runs). Balanced by the folders' seconds on the slowest 2-core
# host (the AVX2-only AMD EPYC; scripts/test.sh's CI selection, measured with both lanes
# running): tests/decoding 2,340, tests/models 1,500, tests/parallel 660, tests/eval 620,
# tests/training 320, the notebook 160, the docs 150, the generate cache 135, every other
# top-level file under 60. Lane A: the model's rooms (models, host, loading: the host's and the
# loaders' tests were part of tests/models' seconds), the parallel and eval folders and the
# notebook; lane B: the decoders' folder, training, every other top-level file and any test
# folder not named here (so that a new folder runs before it is placed).
LANE_A_DIRS="tests/models tests/host tests/loading tests/parallel tests/eval"
LANE_B_DIRS="tests/decoding tests/training"
LANE_A_FILES="tests/test_notebooks.py"
LANE_B_FILES=""
for f in tests/test_*.py; do
  case " $LANE_A_FILES " in *" $f "*) ;; *) LANE_B_FILES="$LANE_B_FILES $f";; esac
done
for d in tests/*/; do
  d=${d%/}
  case " $LANE_A_DIRS $LANE_B_DIRS " in *" $d "*) continue;; esac
  if [ -n "$(find "$d" -name 'test_*.py' -print -quit)" ]; then LANE_B_DIRS="$LANE_B_DIRS $d"; fi
done
DEFAULT_LANES="$LANE_A_DIRS $LANE_A_FILES;$LANE_B_DIRS$LANE_B_FILES"
IFS=';' read -r -a LANES <<<"${DSBD_TEST_LANES:-$DEFAULT_LANES}"
EXTRA=("$@")
# DSBD_TEST_LANE_NAMES: the lanes' prefixes, space-separated (default A B C ...)
read -r -a NAMES <<<"${DSBD_TEST_LANE_NAMES:-A B C D E F G H}"
if [ "${#LANES[@]}" -gt "${#NAMES[@]}" ]; then
  echo "lanes.sh: at most ${#NAMES[@]} lanes, got ${#LANES[@]}" >&2
  exit 2
fi

# pytest's closing line of one folder's output, without the "=" rule ("3 passed in 1.2s")
result_line() {
  grep -E '^=* ?[0-9]+ [a-z]+(, [0-9]+ [a-z]+)* in [0-9.]+s' "$1" | tail -1 | sed -E 's/^=+ //; s/ =+$//'
}

# run_lane LOG FOLDER...: the folders one after another (-u: unbuffered, so every line reaches the
# terminal when pytest writes it; -v: one line per finished test); the outputs also go to LOG
run_lane() {
  local log=$1; shift
  local rc_all=0 group out rc t0 result
  for group in "$@"; do
    echo "== pytest $group"
    out=$(mktemp); t0=$SECONDS
    "$PY" -u -m pytest -v -o console_output_style=count -ra --durations=0 --durations-min=5 \
      ${EXTRA[@]+"${EXTRA[@]}"} $group 2>&1 \
      | tee "$out"
    rc=${PIPESTATUS[0]}
    result=$(result_line "$out")
    echo "== done $group: ${result:-no result line, pytest exit status $rc} ($((SECONDS - t0)) s)"
    cat "$out" >>"$log"; rm -f "$out"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then rc_all=1; fi   # 5: every test deselected
  done
  return $rc_all
}

LOGS=(); PIDS=()
for i in "${!LANES[@]}"; do
  echo "== lane ${NAMES[$i]}: ${LANES[$i]}"
done
# DSBD_TEST_LANES_LIST=1: name the lanes and stop (what tests/test_test_script.py checks)
if [ "${DSBD_TEST_LANES_LIST:-0}" = 1 ]; then exit 0; fi
for i in "${!LANES[@]}"; do
  log=$(mktemp); LOGS+=("$log")
  # sed -u: line by line, so the two lanes' lines interleave whole
  run_lane "$log" ${LANES[$i]} 2>&1 | sed -u "s/^/[${NAMES[$i]}] /" &
  PIDS+=($!)
done
status=0
for pid in "${PIDS[@]}"; do
  wait "$pid" || status=1   # pipefail: the lane's status unless sed itself failed
done
"$PY" - "${LOGS[@]}" <<'PY'
import re, sys
final = re.compile(r"^(\d+ [a-z]+)(, \d+ [a-z]+)* in [0-9.]+s")
counts = {"passed": 0, "failed": 0, "skipped": 0}
for path in sys.argv[1:]:
    for line in open(path, errors="replace"):
        line = line.strip().strip("=").strip()
        if final.match(line):
            for n, what in re.findall(r"(\d+) ([a-z]+)", line.split(" in ")[0]):
                key = "failed" if what in ("failed", "error", "errors") else what
                if key in counts:
                    counts[key] += int(n)
print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
PY
rm -f "${LOGS[@]}"
exit $status
