"""The embedding lookup of a 16-bit model, side by side: the decoders as they are (the rows
gathered as their bits and cast, the table first passed through an optimization barrier with the
tokens, ``llama.embed_rows``) against two former forms: a plain ``nn.Embed`` lookup
(``plain_lookup``: the rows gathered as 16-bit floats, which XLA:CPU runs in float32 after
converting the whole ``[V, d]`` table inside the loops) and the bits without the barrier
(``bits_hoisted``: XLA hoists the whole-table ``uint16`` view out of the loops as a copy,
made once per call). DSBD g2 / W_S 4 / t 0.7 / W_min 2 and speculative sampling g4 on the offline
Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16, end to end (the benchmark prompts, batch 1, EOS off,
top-k 10 / top-p 0.8, each prompt timed after a warm-up call), every variant in its own process,
alternating (``--rounds`` rounds); each compiled program's whole-table conversions and copies
are counted.

    .venv/bin/python benchmarks/probes/embed_gather.py --out results/embed_gather_epyc.json   # ~10 min
    .venv/bin/python benchmarks/probes/embed_gather.py --variants bits_hoisted rows_as_bits \
        --out results/embed_gather_barrier_avx512bf16_epyc.json
    .venv/bin/python benchmarks/probes/embed_gather.py --small --rounds 1 --out /tmp/embed_gather.json
"""

from __future__ import annotations

import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

from benchmarks import variant_processes  # noqa: E402

VARIANTS = ("plain_lookup", "rows_as_bits")
TARGET, DRAFT = variant_processes.TARGET, variant_processes.DRAFT


def table_converts(hlo: str, vocab: int) -> list:
    """The instructions of a compiled program that produce a whole float32 ``[vocab, d]``
    table from a parameter (a conversion of an embedding table)."""
    return [line.strip()[:160] for line in hlo.splitlines()
            if re.search(rf"= f32\[{vocab},\d+\]\S* (convert|fusion)\(", line)]


def table_copies(hlo: str, vocab: int) -> list:
    """The instructions of a compiled program that make a whole ``uint16`` view of a
    ``[vocab, d]`` table on their own (a copy: hoisted out of a loop), not fused into the
    gather that reads its rows."""
    return [line.strip()[:160] for line in hlo.splitlines()
            if re.search(rf"= u16\[{vocab},\d+\]\S* (fusion|copy)\(", line)]


def bits_hoisted():
    """The rows gathered as bits without the optimization barrier: XLA hoists the whole-table
    ``uint16`` view out of the decoders' loops as a copy, made once per call."""
    import jax
    import jax.numpy as jnp

    from dsbd_jax.models import llama

    def embed_rows(embed, tokens):
        table = embed.embedding
        if jnp.dtype(table.dtype).itemsize != 2:
            return embed(tokens).astype(llama.ACT)
        bits = jnp.take(jax.lax.bitcast_convert_type(table, jnp.uint16), tokens, axis=0)
        return jax.lax.bitcast_convert_type(bits, table.dtype).astype(llama.ACT)
    llama.embed_rows = embed_rows


def plain_lookup():
    """The former lookup: ``nn.Embed``'s 16-bit rows, which XLA:CPU gathers in float32."""
    from dsbd_jax.models import llama
    llama.embed_rows = lambda embed, tokens: embed(tokens).astype(llama.ACT)


def main(argv=None):
    return variant_processes.main(
        __file__, __doc__.splitlines()[0],
        {"plain_lookup": plain_lookup, "bits_hoisted": bits_hoisted, "rows_as_bits": None},
        variant_processes.DRAFTED,
        lambda hlo, tc: {"table_converts": table_converts(hlo, tc.vocab_size),
                         "table_copies": table_copies(hlo, tc.vocab_size)}, argv)


if __name__ == "__main__":
    main()
