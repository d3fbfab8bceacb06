"""DSBD's verification with and without the sums it did not need, side by side: the decoders as
they are (a residual's emptiness read off its normaliser, single entries of a row gathered, the
correction's ``p'`` drawn from as it stands) against the former form (``former_sums``: the
normalised residual summed again, one-hot sums over the row for single entries, ``p'`` checked
by a sum and a select). DSBD g2 / W_S 4 / t 0.7 / W_min 2 and speculative sampling g4 (which
shares the residual) on the offline Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16, end to end (the
benchmark prompts, batch 1, EOS off, top-k 10 / top-p 0.8, each prompt timed after a warm-up
call), each variant in its own process, alternating (``--rounds`` rounds; the machinery of
``benchmarks/variant_processes.py``); each compiled program's reductions are counted.

    .venv/bin/python benchmarks/probes/verify_sums.py --out results/verify_sums_avx512bf16_epyc.json
    .venv/bin/python benchmarks/probes/verify_sums.py --small --rounds 1 --out /tmp/verify_sums.json
"""

from __future__ import annotations

import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

from benchmarks import variant_processes  # noqa: E402

VARIANTS = ("former_sums", "fewer_sums")


def former_sums():
    """The verification as it was before the sums were cut."""
    import jax.numpy as jnp

    from dsbd_jax.decoding import speculative

    from dsbd_jax.decoding.dsbd import verify
    from dsbd_jax.decoding.warping import draw_from, residual

    def safe_residual_and_left(p, q):
        r = residual(p, q)
        left = jnp.sum(r, axis=-1, keepdims=True) > 0
        return jnp.where(left, r, p), left

    def verify_with_replacement(u, p_beam, q, cand, cand_ok, width, chain):
        N, C = p_beam.shape[0], cand.shape[0]
        if chain is None:
            chain, _ = verify.residual_chain(p_beam, q, C)
        q_x = verify.pick(q, cand)
        tests = [verify.accept_test(u, chain[j][cand], q_x) for j in range(C)]
        j, n_acc, accepted = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), []
        for c in range(C):
            live = cand_ok[c] & (n_acc < width)
            acc = live & jnp.any(jnp.stack([(j == i) & tests[i][c] for i in range(c + 1)]))
            j = jnp.where(acc, 0, jnp.where(live, j + 1, j))
            n_acc = n_acc + acc.astype(jnp.int32)
            accepted.append(acc)
        p_res = chain[C]
        for i in reversed(range(C)):
            p_res = jnp.where(j == i, chain[i], p_res)
        return verify.CandidateResult(jnp.stack(accepted), n_acc, p_res, jnp.zeros((N,), bool))

    real_correct, real_draw = verify.correct_layer, verify.draw_layer

    def correct_layer(u, g, p_beam, res, cand, width, num_out, replacement):
        if not replacement:
            return real_correct(u, g, p_beam, res, cand, width, num_out, replacement)
        acc_flat, n_acc = verify.compact(cand, res.accepted, num_out)
        p_y = jnp.where(jnp.sum(res.residual) > 0, res.residual, p_beam)
        y = draw_from(p_y, u[:1])[0]
        y_ok = verify.pick(p_y, y) > 0
        fill = draw_from(p_beam, u[1:])
        fill_ok = verify.pick(p_beam, fill) > 0
        k = jnp.arange(num_out)
        f = jnp.clip(k - n_acc - 1, 0, num_out - 1)
        flat = jnp.where(k < n_acc, acc_flat, jnp.where(k == n_acc, y, verify.pick(fill, f)))
        valid = (jnp.where(k < n_acc, True, jnp.where(k == n_acc, y_ok, verify.pick(fill_ok, f)))
                 & (k < width))
        return flat, valid

    def draw_layer(u, g, p_beam, width, num_out, replacement):
        if not replacement:
            return real_draw(u, g, p_beam, width, num_out, replacement)
        flat = draw_from(p_beam, u)
        return flat, (verify.pick(p_beam, flat) > 0) & (jnp.arange(num_out) < width)

    speculative.safe_residual_and_left = safe_residual_and_left
    verify.safe_residual_and_left = safe_residual_and_left
    verify._verify_with_replacement = verify_with_replacement
    verify.correct_layer = correct_layer
    verify.draw_layer = draw_layer


def reductions(hlo: str, target_config) -> dict:
    """The reduce and reduce-window instructions of a compiled program (XLA:CPU sums a long row
    as a chain of them)."""
    return {"reduces": len(re.findall(r"= \S+ (?:reduce|reduce-window)\(", hlo)),
            "fusions": len(re.findall(r"= \S+ fusion\(", hlo))}


def main(argv=None):
    return variant_processes.main(
        __file__, __doc__.split("\n")[0], {"former_sums": former_sums, "fewer_sums": None},
        variant_processes.DRAFTED, reductions, argv)


if __name__ == "__main__":
    main()
