"""The projection products behind :mod:`dsbd_jax.models.kinds`: ``x`` times a kernel in
each stored form (plain ``[in, out]``, transposed ``[out / n, n, in]``, a head's ``[out,
in]`` rows), and the conversions between the forms: the product rules of the kernel kinds of
:mod:`dsbd_jax.models.weights`. Pure functions of
arrays with no dependency inside the package, so that both the model (through
:mod:`~dsbd_jax.models.kinds`) and the per-host measurement of compiler options
(:mod:`~dsbd_jax.host.cpu_options`, which times each form under each candidate) use the
very same products. See :mod:`dsbd_jax.models.kinds` for what each form is for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_mixed(kernel: jax.Array) -> bool:
    """Whether a product with ``kernel`` runs in mixed precision: a kernel stored in a 16-bit
    float (bfloat16, float16) multiplies ``x`` cast to that dtype and accumulates in float32
    (``preferred_element_type``), returning float32. A float32 kernel runs the float32 product
    unchanged. XLA:CPU's 16-bit product with a 16-bit result (what Flax's ``Dense`` computes)
    takes a much slower path than float32; with float32 accumulation the same product runs at
    float32's speed or faster (``benchmarks/probes/matmul.py --dtypes``; figures in
    ``docs/results/precision.md``)."""
    return jnp.dtype(kernel.dtype).itemsize == 2


def _rows2(xm: jax.Array) -> jax.Array:
    """``xm [m, in]`` with one row padded to two (XLA:CPU's 16-bit product of one row takes a
    matrix-vector path, much slower than the product of two rows); more rows unchanged."""
    return jnp.pad(xm, ((0, 1), (0, 0))) if xm.shape[0] == 1 else xm


def _mixed(x: jax.Array, kernel: jax.Array, k_in: int) -> jax.Array:
    """``x [..., in]`` times a 2-D ``kernel`` whose axis ``k_in`` is ``in``: ``x`` cast to the
    kernel's dtype (one row padded to two, :func:`_rows2`), float32 accumulation, float32
    ``[..., out]``."""
    lead = x.shape[:-1]
    xm = x.reshape(-1, x.shape[-1])
    y = jax.lax.dot_general(_rows2(xm).astype(kernel.dtype), kernel, (((1,), (k_in,)), ((), ())),
                            preferred_element_type=jnp.float32)[:xm.shape[0]]
    return y.reshape(*lead, kernel.shape[1 - k_in])


def mixed_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """``x [..., in]`` times ``rows [out, in]`` (a kernel stored as its output rows, the
    ``[out, in]`` form): ``x`` cast to the kernel's dtype, float32 accumulation, float32
    ``[..., out]``. One row is padded to two (:func:`_rows2`). Meant for 16-bit kernels; a
    float32 kernel gives the float32 product."""
    return _mixed(x, rows, 1)


def mixed_cols(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x [..., in]`` times a 16-bit ``kernel [in, out]`` (Flax's form), float32 accumulation,
    float32 ``[..., out]``; one row padded to two."""
    return _mixed(x, kernel, 0)


def project(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x [..., in]`` times a plain ``kernel [in, out]``; a 16-bit kernel runs in mixed
    precision (:func:`is_mixed`)."""
    if is_mixed(kernel):
        return mixed_cols(x, kernel)
    # the Flax Dense product, unchanged
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


# int8 kernels (weights.Int8): codes [out, in] with one scale per output row
INT8_MAX = 127


def quantize_rows(w: jax.Array):
    """``w [..., out, in]`` (any float) -> ``(codes int8 [..., out, in], scales float32 [...,
    out])``: each output row scaled by its largest magnitude over ``127`` (symmetric, round to
    nearest), so ``codes * scales[..., None]`` is within half a step of ``w``. An all-zero row
    gets scale 1 and zero codes (never a division by zero); a row holding a NaN or an infinity
    gets a non-finite scale, so whatever is multiplied by it after is non-finite too, as a float
    product's would be (a NaN never turns into a finite number here)."""
    w = jnp.asarray(w, jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=-1)
    scales = jnp.where(amax == 0, 1.0, amax / INT8_MAX)
    codes = jnp.clip(jnp.round(w / scales[..., None]), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return codes, scales.astype(jnp.float32)


def int8_rows(x: jax.Array, codes: jax.Array, scales: jax.Array) -> jax.Array:
    """``x [..., in]`` (float) times int8 ``codes [out, in]`` with per-output ``scales [out]``:
    float32 ``[..., out]``.

    ``x`` is quantised on the fly, each row to int8 by its own largest magnitude
    (:func:`quantize_rows`), and the product runs as XLA's integer dot ``s8 x s8 -> s32``
    (contracting both operands' last axis, the form XLA:CPU runs natively, several times
    faster than float32 at two rows and more: ``benchmarks/int8_products.py``); the row and
    output scales are applied to the int32 sums after. One row is padded to two
    (:func:`_rows2`): XLA:CPU's one-row integer product takes a slow matrix-vector path. The
    sums are exact in int32 for ``in`` below 133,000 (``127 * 127 * in < 2**31``)."""
    lead = x.shape[:-1]
    din = x.shape[-1]
    xm = x.reshape(-1, din).astype(jnp.float32)
    xq, xs = quantize_rows(xm)
    y = jax.lax.dot_general(_rows2(xq), codes, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.int32)[:xm.shape[0]]
    y = y.astype(jnp.float32) * xs[:, None] * scales
    return y.reshape(*lead, codes.shape[0])


# transposed kernels: [out, in] rows, kept as [out / n, n, in] blocks (weights.RowBlocks)
TRANSPOSED = "transposed"
# transposed blocks of at most this many output rows (wider blocks are slower: docs/results/cpu.md)
T_MAX_WIDTH = 1280


def transpose_block(w: jax.Array, n: int) -> jax.Array:
    """``[..., in, out]`` -> ``[..., out / n, n, in]``: the kernel's rows as ``[out, in]`` (one
    output per row, contiguous), cut into ``out / n`` blocks of ``n`` rows (``n`` divides
    ``out``; ``n = out``: one block)."""
    *lead, din, dout = w.shape
    if n < 1 or dout % n:
        raise ValueError(f"block width {n} does not divide the kernel's {dout} output columns")
    return jnp.reshape(jnp.swapaxes(w, -1, -2), (*lead, dout // n, n, din))


def untranspose(w: jax.Array) -> jax.Array:
    """``[..., c, n, in]`` -> ``[..., in, c * n]`` (the inverse of :func:`transpose_block`)."""
    *lead, c, n, din = w.shape
    return jnp.swapaxes(jnp.reshape(w, (*lead, c * n, din)), -1, -2)


def project_t(x: jax.Array, kernel_t: jax.Array) -> jax.Array:
    """``x [..., in]`` times a transposed kernel ``[c, n, in]`` (:func:`transpose_block`).

    One row (``x`` of one row in all: a token at batch 1) is a matrix-vector product over the
    ``[out, in]`` rows (a free reshape), which XLA:CPU runs as dot products of contiguous rows,
    faster than the same product on ``[in, out]``. More rows run as one batched product
    ``W_c x^T`` per block (the same product with the whole ``[out, in]`` matrix as one operand
    is several times slower under Eigen), then transposed back. Whole passes:
    ``benchmarks/forward.py --layouts per_layer per_layer_transposed``, ``docs/results/cpu.md``.

    A 16-bit kernel runs as one mixed-precision product over all ``[out, in]`` rows
    (:func:`mixed_rows`: float32 accumulation and result, one row padded to two)."""
    c, n, din = kernel_t.shape
    if is_mixed(kernel_t):
        return mixed_rows(x, kernel_t.reshape(c * n, din))
    lead = x.shape[:-1]
    xm = x.reshape(-1, din)
    m = xm.shape[0]
    if m == 1:
        y = jax.lax.dot_general(xm, kernel_t.reshape(c * n, din), (((1,), (1,)), ((), ())))
    else:
        y = jax.lax.dot_general(kernel_t, jnp.broadcast_to(xm, (c,) + xm.shape),
                                (((2,), (2,)), ((0,), (0,))))  # [c, n, m]
        y = y.transpose(2, 0, 1).reshape(m, c * n)
    return y.reshape(*lead, c * n)


def transposed_width(dout: int) -> int:
    """The row-block width of a transposed kernel with ``dout`` outputs: the largest divisor of
    ``dout`` that splits it in two or more and is 8 to ``T_MAX_WIDTH`` (a multiple of 64 where
    one fits), else ``dout`` (one block)."""
    divs = [n for n in range(8, min(dout // 2, T_MAX_WIDTH) + 1) if dout % n == 0]
    aligned = [n for n in divs if n % 64 == 0]
    return max(aligned or divs or [dout])

