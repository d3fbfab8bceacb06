#!/usr/bin/env bash
# One run of benchmarks.accelerator on a GPU machine: bash scripts/gpu_bench.sh OUTDIR
#
# Uses the machine's own Python stack (jax 0.11.x with the CUDA plugin, transformers; nothing is
# installed from a registry). Small wheels this project needs and the machine lacks (flax, gguf,
# chex, optax) can be carried in ./wheels and are installed from there, offline, into a user site.
# Writes OUTDIR/<device>.json, OUTDIR/accelerator.log and OUTDIR/env.txt. XLA_FLAGS set by the
# caller are kept. (Kernel launches per iteration from XLA's dump were counted by
# benchmarks/gpu_kernels.py, retired: `git show 90d572c:scripts/gpu_bench.sh` runs it.)
set -euo pipefail
OUT="${1:?usage: scripts/gpu_bench.sh OUTDIR}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if [ -d wheels ] && ls wheels/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --user --no-index --find-links wheels --no-deps wheels/*.whl
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # peak memory figures are the program's, not the pool's
export DSBD_JAX_CACHE="$OUT/cache"           # any per-host choice is written next to the results
unset JAX_ENABLE_X64
{ nvidia-smi || true; "$PY" -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__); print(jax.devices())"; env | grep -E '^(XLA_|JAX_|CUDA_)' || true; } > "$OUT/env.txt" 2>&1
DEVICE=$("$PY" -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
# under 8 minutes on one H100: the script stops starting new items after --budget-s
"$PY" -m benchmarks.accelerator --budget-s 420 --out "$OUT/$DEVICE.json" "${@:2}" 2>&1 | tee "$OUT/accelerator.log"
echo "results: $OUT/$DEVICE.json (commit it under results/gpu/)"
