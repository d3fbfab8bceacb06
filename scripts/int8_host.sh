#!/usr/bin/env bash
# The int8 issue's measurements on one more host class (the one not measured yet: AVX-512
# without AVX512-BF16 or AMX, where dtype="auto" is float32), or on any host again:
#   bash scripts/int8_host.sh LABEL
#
# LABEL names the host in the files, e.g. avx512_xeon. Four benchmarks, one after
# the other, each writing results/<benchmark>_<LABEL>.json (about an hour on 2 cores in all):
#   1. benchmarks.pass_floor   whole passes of both models, float kinds and int8, 1/4/12 rows
#   2. benchmarks.speed        sampling, beam W=4, speculative g4 and DSBD's beam-W4 point
#                              with the int8 draft, the float target in the host's dtype
#   3. benchmarks.speed        the same with the float and the int8 target, float32
#   4. benchmarks.draft_terms  the draft's pass against the target's, batch 1 and 4
# (the int8 products alone, once step 1 here: `git show 90d572c:benchmarks/int8_products.py`)
# A step whose file exists is skipped: after a stop, the same command goes on with the next.
# Run it on a quiet machine (every ratio is timed side by side within one step), then add the
# host to docs/results/index.md and the figures to the pages. DSBD_INT8_HOST_DRY=1 prints the
# steps' commands instead of running them (no setup either).
set -euo pipefail
LABEL="${1:?usage: scripts/int8_host.sh LABEL (the host in the file names, e.g. avx2_epyc)}"
case "$LABEL" in
  *[!A-Za-z0-9_]*) echo "int8_host: LABEL may hold letters, digits and _ only" >&2; exit 2;;
esac
cd "$(dirname "$0")/.."
DRY="${DSBD_INT8_HOST_DRY:-}"
[ -n "$DRY" ] || bash scripts/setup.sh
PY="${PYTHON:-.venv/bin/python}"
# the host's own dtype (what dtype="auto" starts from: float32 without AMX-BF16 or AVX512-BF16)
DTYPE=$("$PY" -c "from dsbd_jax.host.plan import prior_dtype; print(prior_dtype()[0])")
"$PY" -c "from dsbd_jax.eval.timing import machine_info; m = machine_info(); \
print('int8_host: host', m['cpu_model'], m['cpu_count'], 'cores,', ' '.join(m['cpu_flags']), \
      '-> dtype $DTYPE')"

step() {  # step OUT MODULE ARGS...: run python -m MODULE ARGS unless OUT exists
  local out="$1"; shift
  if [ -e "$out" ]; then echo "int8_host: $out exists, skipped"; return; fi
  if [ -n "$DRY" ]; then echo "$PY -m $*"; return; fi
  echo "int8_host: $PY -m $*"
  "$PY" -m "$@"
}

R=results
step "$R/pass_floor_int8_$LABEL.json" benchmarks.pass_floor --models draft target \
  --dtypes bfloat16 float32 --forms host int8 --rows 1 4 12 --out "$R/pass_floor_int8_$LABEL.json"
step "$R/speed_int8_draft_$LABEL.json" benchmarks.speed --prompts 4 --max-new-tokens 64 \
  --dsbd 2,4,0.7,2 --widths 4 --gamma 4 --skip-hf --draft-weights int8 --dtypes "$DTYPE" \
  --out "$R/speed_int8_draft_$LABEL.json"
step "$R/speed_int8_target_$LABEL.json" benchmarks.speed --prompts 2 --max-new-tokens 32 \
  --dsbd 2,4,0.7,2 --widths 4 --gamma 4 --skip-hf --dtypes float32 --target-weights float int8 \
  --draft-weights int8 --out "$R/speed_int8_target_$LABEL.json"
step "$R/draft_terms_int8_$LABEL.json" benchmarks.draft_terms --drafts base int8 \
  --batch-drafts base int8 --gammas 4 --methods speculative_g4 dsbd_beamW4_point --repeats 3 \
  --out "$R/draft_terms_int8_$LABEL.json"
[ -n "$DRY" ] || echo "int8_host: done: results/*_$LABEL.json (commit them; name the host in" \
  "docs/results/index.md)"
