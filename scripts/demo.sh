#!/usr/bin/env bash
# Quickstart 1: set up, then run DSBD on the default offline model pair and print outputs and speed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m dsbd_jax demo "$@"
