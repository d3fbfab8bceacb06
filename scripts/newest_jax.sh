#!/usr/bin/env bash
# The newest-JAX lane: the decoders' exactness tests under the newest jax/jaxlib release on
# Python 3.12 (the install accepts it there; Python 3.10-3.11 stay on the pinned 0.10.2), so a
# regression of a new jax (like jax#40101 in jaxlib 0.11.1) is seen when it appears.
#
# Where a Python >= 3.12 interpreter exists ($DSBD_PY312, else python3.13 or python3.12 on PATH,
# else the newest ~/.pyenv/versions/3.1[2-9]*)
# it builds .venv-jax-newest (once; later runs only upgrade jax/jaxlib to the newest release)
# with dsbd-jax, pytest, hypothesis and scipy, and runs the test files below (the verification
# rule, the width rule, and the exactness tests of tree and DSBD decoding (CI: not the extended ones), which
# need no torch: PyPI's torch for 3.12 is the multi-GB CUDA build, so it is left out). Where no
# such interpreter exists it says so and counts one skip. The last line is pytest's counts,
# "N passed, N failed, N skipped", which scripts/test.sh adds to the suite's.
#   bash scripts/newest_jax.sh                      # the lane
#   bash scripts/newest_jax.sh --which              # the interpreter it would use, or "none"
#   bash scripts/newest_jax.sh tests/decoding/dsbd/test_verify.py   # other test paths
#   bash scripts/newest_jax.sh --bench OUT.json     # benchmarks.accelerator under the newest jax
#                                                   # (the items the retired benchmarks/jax_versions.py compared;
#                                                   # run it under .venv too, on a quiet host)
set -uo pipefail
cd "$(dirname "$0")/.."
# the interpreter: $DSBD_PY312, else python3.13 / python3.12 on PATH, else the newest
# ~/.pyenv/versions/3.1[2-9]*; any of them only if it is Python >= 3.12
at_least_312() { [ -x "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
find_py312() {
  if [ -n "${DSBD_PY312:-}" ]; then echo "$DSBD_PY312"; return; fi
  local c
  for c in "$(command -v python3.13)" "$(command -v python3.12)" \
           $(ls -d "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV); do
    if [ -n "$c" ] && at_least_312 "$c"; then echo "$c"; return; fi
  done
  echo "$HOME/.pyenv/versions/3.12.1/bin/python"     # named in the skip message
}
PY312=$(find_py312)
if [ "${1:-}" = "--which" ]; then   # only say which interpreter the lane would use
  at_least_312 "$PY312" && echo "$PY312" || echo "none"
  exit 0
fi
VENV=${DSBD_NEWEST_VENV:-.venv-jax-newest}
TESTS=(tests/decoding/dsbd/test_verify.py tests/decoding/dsbd/test_width.py tests/decoding/test_tree.py
       tests/decoding/dsbd/test_dsbd.py)
if ! at_least_312 "$PY312"; then
  echo "newest-jax: SKIPPED: no Python >= 3.12 interpreter (\$DSBD_PY312, python3.13 or python3.12 on PATH, ~/.pyenv/versions/3.1[2-9]*; tried $PY312)"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
LOG=$(mktemp)
pip_install() {
  if ! "$VENV/bin/python" -m pip install -q "$@" >>"$LOG" 2>&1; then
    cat "$LOG" >&2; echo "newest-jax: pip install $* failed" >&2
    echo "0 passed, 1 failed, 0 skipped"; exit 1
  fi
}
T0=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
  echo "newest-jax: creating $VENV with $("$PY312" --version 2>&1)"
  "$PY312" -m venv "$VENV"
  pip_install -e . "pytest>=8" "hypothesis>=6" "scipy>=1.11"
fi
# the newest release the project accepts (pyproject: jax >= 0.10.2, < 0.13, != 0.11.1)
pip_install --upgrade "jax>=0.10.2,<0.13,!=0.11.1" "jaxlib>=0.10.2,<0.13,!=0.11.1"
rm -f "$LOG"
echo "newest-jax: $("$VENV/bin/python" -c 'import sys, jax, jaxlib, flax; print("Python", sys.version.split()[0], "jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__)') (setup $((SECONDS - T0)) s)"
if [ "${1:-}" = "--setup-only" ]; then   # scripts/test.sh: the venv made while the lanes run
  exit 0
fi
if [ "${1:-}" = "--bench" ]; then
  exec "$VENV/bin/python" -m benchmarks.accelerator --out "${2:?usage: newest_jax.sh --bench OUT.json}" "${@:3}"
fi
[ $# -gt 0 ] && TESTS=("$@")
OUT=$(mktemp)
# light tests only (tiny models): they need not wait for the real-model tests beside them
EXT=(-m "not extended"); [ "${DSBD_TEST_EXTENDED:-0}" = 1 ] && EXT=()
DSBD_TEST_MEMORY_LOCK=0 "$VENV/bin/python" -u -m pytest -q -ra -p no:cacheprovider "${EXT[@]}" \
  "${TESTS[@]}" \
  2>&1 | tee "$OUT"
rc=${PIPESTATUS[0]}
line=$(grep -E '^=* ?[0-9]+ [a-z]+(, [0-9]+ [a-z]+)* in [0-9.]+s' "$OUT" | tail -1)
rm -f "$OUT"
count() { echo "$line" | grep -oE "[0-9]+ $1" | head -1 | cut -d' ' -f1; }
p=$(count passed); f=$(count failed); e=$(count error); s=$(count skipped)
f=$(( ${f:-0} + ${e:-0} ))
[ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$f" -eq 0 ] && f=1   # pytest failed without a count
echo "newest-jax: done in $((SECONDS - T0)) s"
echo "${p:-0} passed, $f failed, ${s:-0} skipped"
[ "$f" -eq 0 ]
