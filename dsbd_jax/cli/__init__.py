"""Command line: the ``dsbd`` console script, or ``python -m dsbd_jax``.

``options`` builds the parser (:func:`~dsbd_jax.cli.options.build_parser`; ``dsbd --help``
prints :data:`~dsbd_jax.cli.options.DESCRIPTION`: every subcommand with an example, and how
``generate`` runs), ``commands`` holds the subcommands and ``main``, ``running`` what they share
(checking options and prompts, loading the models, running a decoder with progress). Invariant:
settings and prompts are checked on their own before any model file is read, then against the
models' configs before any weights are loaded; bad input ends in one line (``dsbd: error:
...``) with exit status 2.
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
