"""DSBD's draft warp and verification on the entries a warp can keep (``dsbd_jax.decoding.dsbd.tops``)
against the former form on whole rows of the vocabulary (``full_rows``: ``tops.sparse_applies``
patched to False, so the draft warps and draws over ``[P * V]`` and the verification runs on
``[P * V]`` vectors, as before), side by side: DSBD g2 / W_S 4 / t 0.7 / W_min 2 and beam
sampling W=4 (the same program in both, a check of the machine's drift) on the offline
Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16, end to end (the benchmark prompts, batch 1, EOS off,
top-k 10 / top-p 0.8, each prompt timed after a warm-up call), each variant in its own process,
alternating (``--rounds`` rounds; ``benchmarks/variant_processes.py``); each compiled program's
fusions and reductions are counted.

    .venv/bin/python benchmarks/probes/verify_tops.py --out results/verify_tops_amx_xeon.json
    .venv/bin/python benchmarks/probes/verify_tops.py --small --rounds 1 --out /tmp/verify_tops.json
"""

from __future__ import annotations

import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

from benchmarks import variant_processes  # noqa: E402


def full_rows():
    """The draft's warp and the verification on whole rows, as before ``tops``."""
    from dsbd_jax.decoding.dsbd import forest, tops
    tops.sparse_applies = forest.sparse_applies = lambda config: False


def counts(hlo: str, target_config) -> dict:
    """The fusions and the reduce / reduce-window instructions of a compiled program."""
    return {"reduces": len(re.findall(r"= \S+ (?:reduce|reduce-window)\(", hlo)),
            "fusions": len(re.findall(r"= \S+ fusion\(", hlo))}


def main(argv=None):
    return variant_processes.main(
        __file__, __doc__.split("\n")[0], {"full_rows": full_rows, "tops": None},
        ("dsbd_g2_WS4_t0.7_Wmin2", "beam_sample_W4"), counts, argv)


if __name__ == "__main__":
    main()
