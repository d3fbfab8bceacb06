"""The attention's softmax, side by side: the decoders as they are (``llama.attend``: the keys as
the products' first operand, the weights normalised after the values product) against the former
form (``jax.nn.softmax`` over the scores, then the values product, queries first), on sampling,
beam sampling W=4, DSBD g2 / W_S 4 / t 0.7 / W_min 2 and speculative sampling g4 with the offline
Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16, end to end (the benchmark prompts, batch 1, EOS off,
top-k 10 / top-p 0.8, each prompt timed after a warm-up call), every variant in its own process,
alternating (``--rounds`` pairs; ``benchmarks/variant_processes.py``). Each compiled program's
``dot`` and fusion instructions are counted.

    .venv/bin/python benchmarks/attention_form.py --out results/attention_form_epyc.json  # ~15 min
    .venv/bin/python benchmarks/attention_form.py --small --rounds 1 --out /tmp/attention_form.json
"""

from __future__ import annotations

import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

from benchmarks import variant_processes  # noqa: E402

VARIANTS = ("softmax_then_values", "normalised_after_values")
DECODERS = variant_processes.UNDRAFTED + variant_processes.DRAFTED


def softmax_then_values():
    """The former ``llama.attend`` (to 2026-11-29): the same scores, ``jax.nn.softmax``, then
    the values product, the queries the products' first operand."""
    import jax
    import jax.numpy as jnp

    from dsbd_jax.models import llama

    def attend(q, keys, values, mask, scale, cap=None):
        scores = jnp.einsum("btkgd,bskd->bkgts", q, keys,
                            preferred_element_type=jnp.float32) * scale
        scores = llama.softcap(scores, cap)
        scores = jnp.where(mask[:, None, None, :, :], scores, llama._NEG)
        probs = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("bkgts,bskd->btkgd", probs, values)
    llama.attend = attend


_OPS = re.compile(r"=\s*\S+\s+(fusion|dot)\(")


def instructions(hlo: str, _config=None) -> dict:
    """How many ``fusion`` and ``dot`` instructions a compiled program's text holds (every
    computation: the decode loop's body is its own)."""
    counts = {"fusion": 0, "dot": 0}
    for line in hlo.splitlines():
        m = _OPS.search(line)
        if m:
            counts[m.group(1)] += 1
    return {"instructions": counts}


def main(argv=None):
    return variant_processes.main(
        __file__, __doc__.splitlines()[0],
        {"softmax_then_values": softmax_then_values, "normalised_after_values": None},
        DECODERS, instructions, argv)


if __name__ == "__main__":
    main()
