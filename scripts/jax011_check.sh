#!/usr/bin/env bash
# Run the test suite under jax/jaxlib 0.11.x on the CPU (the library must run on
# jax 0.11.x, the GPU machine's stack, as well as the pinned 0.10.2). Not part of CI.
#
# jax 0.11 needs Python >= 3.12 (its 0.11.0 changelog drops 3.11), and the development machine
# has 3.11, so `pip index versions jax` there stops at 0.10.2. This script builds a Debian trixie
# root (Python 3.13) with debootstrap, installs the project there with its own dependency list
# (on Python >= 3.12 it admits jax 0.11.x; JAX_VERSION pins which) and pytest's tools into a venv,
# and runs pytest over the bind-mounted checkout.
# Needs root and the Debian and PyPI registries; about 5 minutes to build, 10 to run.
# torch is left out (PyPI's Linux torch needs several GB of CUDA packages): tests that build
# models with torch skip or fail on the import, and so do those that need the offline weight
# and dataset packages; the summary line counts them with the others.
#   sudo bash scripts/jax011_check.sh [ROOT_DIR] [pytest args...]   (default $TMPDIR/dsbd-trixie)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${1:-${TMPDIR:-/tmp}/dsbd-trixie}"; shift || true
JAX=${JAX_VERSION:-0.11.2}
if [ ! -x "$ROOT/usr/bin/python3" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates trixie "$ROOT" \
    http://deb.debian.org/debian
fi
cp /etc/resolv.conf "$ROOT/etc/"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"  # a proxy's CA
mkdir -p "$ROOT/repo" "$ROOT/proc"
mountpoint -q "$ROOT/proc" || mount --bind /proc "$ROOT/proc"
mountpoint -q "$ROOT/repo" || mount --bind "$PWD" "$ROOT/repo"
chroot "$ROOT" bash -c "
  set -e
  [ -x /opt/v/bin/python ] || python3 -m venv /opt/v
  # the test extra without torch, matplotlib and the notebook tools (see above)
  /opt/v/bin/pip install -q /repo jax==$JAX jaxlib==$JAX 'pytest>=8' 'hypothesis>=6' \
    'scipy>=1.11' import-linter==2.16
  /opt/v/bin/python -c 'import sys, jax, jaxlib, flax; print(sys.version.split()[0], \"jax\", jax.__version__, \"jaxlib\", jaxlib.__version__, \"flax\", flax.__version__)'
  cd /repo
  export PYTHONPATH=/repo:/repo/tests HOME=/root
  if [ \$# -gt 0 ]; then exec /opt/v/bin/python -m pytest -q -p no:cacheprovider -rfE \"\$@\"; fi
  for g in tests/decoding tests/models tests/host tests/loading tests/training tests/parallel tests/eval \
    tests/test_*.py; do
    echo \"== \$g\"
    /opt/v/bin/python -m pytest -q -p no:cacheprovider --continue-on-collection-errors -rfE \$g || true
  done
" bash "$@"
