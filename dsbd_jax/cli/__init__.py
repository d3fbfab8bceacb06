"""Command line (the ``dsbd`` console script, or ``python -m dsbd_jax``):

    dsbd demo                                    # DSBD vs beam sampling on the default offline pair
    dsbd generate --prompt "..." [--method dsbd|beam|sample|spec|tree|beam_search] [settings]
    dsbd bench configs/quick_cpu.yaml --out runs/quick_cpu
    dsbd plot runs/quick_cpu/records.jsonl
    dsbd summary runs/quick_cpu               # the summary of a run, finished or not
    dsbd make-tiny-pair /tmp/dsbd_tiny           # tiny random models for configs/tiny.yaml (torch)
    dsbd vocab build --model M --task gsm8k:40:  # token-frequency table for a truncated draft head
    dsbd vocab show TABLE                        # its coverage at N = 16k/32k/64k
    dsbd distill configs/distill_qwen_fkl.yaml   # distil the draft towards the target (resumable)
    dsbd train-head configs/head_qwen.yaml       # train a feature-level draft head (resumable)
    dsbd host [--model M]                        # how this host runs a model: dtype, kernels, options

``generate`` runs its decoder once, showing the elapsed seconds (``--progress time``, the
default) or a bar per decoder iteration (``--progress tokens``: new tokens, iterations, target
calls and, for DSBD, the accepted draft candidates per verified layer; no rate), then prints
the run's tokens/s and every beam with its target log-likelihood. Neither progress mode puts a
host callback in the compiled programs, so both keep them in the compilation cache
(``$DSBD_JAX_CACHE/xla``; ``DSBD_JAX_COMPILATION_CACHE=0`` turns it off) and a later run
compiles nothing. Each command that loads a model prints one line per model: the dtype and
weight kind it runs in, and why. ``--help``, argument errors and the settings' refusals answer
before JAX is imported; settings and prompts are then checked against the models' configs
before any weights are loaded. Errors for bad input are printed as one line
(``dsbd: error: ...``) with exit status 2.

Many processes (JAX's multi-controller runtime): ``generate`` and ``bench`` run unchanged when
started once per process with ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` set (``dsbd_jax.parallel.distributed.initialize``); with ``--mesh`` each
process decodes its share of the prompts, only process 0 prints results and writes files, and
progress bars are off. On one machine, N processes of 4 virtual CPU devices each::

    N=2; for i in $(seq 0 $((N-1))); do JAX_COORDINATOR_ADDRESS=127.0.0.1:12345 JAX_NUM_PROCESSES=$N JAX_PROCESS_ID=$i XLA_FLAGS=--xla_force_host_platform_device_count=4 dsbd generate --mesh data=4,model=2 --no-progress --prompt hi & done; wait
"""

from dsbd_jax.cli.options import (  # noqa: E402,F401
    DEFAULT_DRAFT, DEFAULT_TARGET, CLIError, build_parser, _settings)
from dsbd_jax.cli.running import (  # noqa: E402,F401
    ElapsedTicker, ProgressBar, build_decoder, check_options, load_models, prepare, progress_mode,
    run_method, tokens_per_second)
from dsbd_jax.cli.commands import main  # noqa: E402,F401
from dsbd_jax.cli.demo import demo_draft, demo_verdict  # noqa: E402,F401

__all__ = ["main", "build_parser", "CLIError", "DEFAULT_TARGET", "DEFAULT_DRAFT", "ProgressBar",
           "ElapsedTicker", "build_decoder", "check_options", "prepare", "load_models",
           "run_method", "tokens_per_second", "progress_mode", "demo_draft", "demo_verdict"]
