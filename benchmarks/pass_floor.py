"""The products floor of a forward pass, and the pass on it: how far a pass is from its products.

For each model (``--models``, default the offline pair's shapes: ``target`` Qwen2.5-Coder-1.5B,
``draft`` Qwen2.5-Coder-0.5B with its tied head), dtype (``--dtypes float32 bfloat16``), kernel
form (``--forms``, default ``host``: the form ``load_model`` picks on this host,
``forms.choose_form``; or ``plain`` / ``transposed``) and row count (``--rows 1 4 12 16 32 64``),
with random weights (``llama.init_params``'s tree and laws, in the per-layer layout of the CPU;
kernels stored as ``load_model`` stores them: transposed with ``kinds.transpose_params_``, a
16-bit model's head then as ``[V, d]`` rows), it times two programs, interleaved round by round
(median of ``--repeats``; compile excluded, each program runs once untimed first):

* **floor**: the pass's matrix products alone, chained as the pass runs them: per layer the
  q/k/v projections of the layer's input, o of the q product (waiting for k and v too, as
  attention does), gate and up of the residual, down of their product; then the vocabulary head
  (``lm_head``, or the tied embedding through ``vocab.tied_logits``). Every product is the
  model's own (``llama.dense_product``, what ``llama.Dense`` runs: same kernel form, dtype,
  float32 accumulation for 16-bit kernels, one row padded to two), compiled under the same
  XLA:CPU options (``cpu_options.tuned_jit`` over the same parameter tree). The glue between
  products is the pass's residual adds and two cheap joins (a row mean of k and v added to q;
  gate times up); no bias, norm, RoPE, attention, softmax or cache;
* **pass**: the whole forward (``llama.forward``) at the same shapes over a KV cache of
  ``--slots`` slots, set up as ``_drafts.pass_call`` sets up the draft benchmarks' passes
  (empty cache, all-ones mask, ``cpu_options.tuned_jit``), logits at every new token;
* **no_attention**: the same pass with every layer's attention (``llama.attend``: scores,
  softmax, values product, and the cache's concatenation it reads) replaced by its queries,
  patched in while this program alone is traced (:func:`without_attention`): the pass less
  its attention, in place, so ``pass_ms - no_attention_ms`` is what the attention costs there
  (``docs/performance.md``, *The products floor*).

Rows: ``--shape auto`` (default) runs 1 and 4 as rows of one new token (``[n, 1]``: a decode
step, beams) and more as one row of ``n`` tokens (``[1, n]``: a DSBD forest, a speculative
chain); ``rows`` or ``tokens`` forces one shape for every count. Each entry records its ``B``,
``T`` and shape. The JSON holds, per model, dtype and form, the product list the floor runs
(``layers * 7 + 1``), the ``dot_general`` count of each program's jaxpr (the pass has the
floor's plus the attention's four per layer: scores and values over the cache and over
the new tokens) and per row count ``floor_ms``, ``pass_ms``,
``pass_over_floor``, ``no_attention_ms`` and ``no_attention_over_floor``, and what the products
compute and how fast (:func:`rates`: the floor's and the attention's GFLOP, the attention's share
of the floor's, each one's GFLOP/s; counted from the jaxprs); ``--hlo`` adds the
instruction counts of each compiled program's entry computation. The JSON is written after every row count (a run cut off by a time
limit keeps what it measured); a Markdown table is printed at the end.

    .venv/bin/python -m benchmarks.pass_floor --out results/pass_floor.json
    .venv/bin/python -m benchmarks.pass_floor --models target --dtypes bfloat16 --rows 1 12 \\
        --forms plain transposed --out /tmp/pass_floor.json
    .venv/bin/python -m benchmarks.pass_floor --small --out /tmp/pass_floor_small.json  # seconds
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import re
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QWEN = dict(vocab_size=151936, num_kv_heads=2, rope_theta=1e6, attention_bias=True,
            architecture="qwen2", max_position_embeddings=32768)
MODELS = {  # benchmarks/accelerator.py PAIRS["qwen"]: the offline pair's shapes
    "target": dict(QWEN, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                   head_dim=128),
    "draft": dict(QWEN, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                  head_dim=64, tie_word_embeddings=True),
}
SMALL = dict(vocab_size=512, num_kv_heads=2, attention_bias=True, architecture="qwen2",
             max_position_embeddings=8192)
SMALL_MODELS = {  # --small: the same two kinds of head (untied with biases; tied), tiny
    "target": dict(SMALL, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   head_dim=16),
    "draft": dict(SMALL, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                  head_dim=8, tie_word_embeddings=True),
}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ROWS_UP_TO = 4  # --shape auto: counts up to this are rows of one token, more one row of tokens


def shape_of(n: int, shape: str = "auto"):
    """``(B, T, shape)`` of a pass with ``n`` new tokens: ``rows`` ``[n, 1]``, ``tokens``
    ``[1, n]``; ``auto``: rows up to ``ROWS_UP_TO``, tokens above (one token is ``[1, 1]``)."""
    if shape == "auto":
        shape = "rows" if n <= ROWS_UP_TO else "tokens"
    return (n, 1, shape) if shape == "rows" else (1, n, shape)


def floor_products(config, params):
    """``[(name, Dense parameters or the tied embedding)]``: the products of a forward pass in
    the order it runs them (per layer q, k, v, o, gate, up, down; then the head). Per-layer
    layout (``params["layers_{i}"]``)."""
    out = []
    for i in range(config.num_layers):
        layer = params[f"layers_{i}"]
        out += [(f"layers_{i}.attn.{p}", layer["attn"][p]) for p in ATTENTION]
        out += [(f"layers_{i}.mlp.{p}", layer["mlp"][p]) for p in MLP]
    if config.tie_word_embeddings:
        out.append(("embed (tied head)", params["embed"]["embedding"]))
    else:
        out.append(("lm_head", params["lm_head"]))
    return out


def product_list(config, params):
    """:func:`floor_products` as the JSON records it: name, stored kind (``"plain"``, a typed
    kernel's kind: ``"RowBlocks"``, ``"Rows"``; or ``"embedding"``), stored shape and dtype."""
    from dsbd_jax.models import weights
    out = []
    for name, leaf in floor_products(config, params):
        if isinstance(leaf, dict) or hasattr(leaf, "keys"):
            arr = leaf["kernel"]
            kind = type(arr).__name__ if weights.is_kernel(arr) else "plain"
            if weights.is_kernel(arr):
                arr = getattr(arr, arr.fields[0])
        else:
            kind, arr = "embedding", leaf
        out.append({"name": name, "stored": kind, "shape": list(arr.shape),
                    "dtype": str(arr.dtype)})
    return out


def floor(config, params, x):
    """The pass's products alone, chained as the pass runs them (module docstring):
    ``x [B, T, d]`` float32 through every layer's seven products and the head; float32 logits
    ``[B, T, V]``."""
    from dsbd_jax.models.llama import dense_product
    from dsbd_jax.models.vocab import tied_logits
    import jax.numpy as jnp
    dt = config.jnp_dtype
    steps = floor_products(config, params)
    for i in range(config.num_layers):
        (_, q), (_, k), (_, v), (_, o), (_, g), (_, u), (_, d) = steps[7 * i: 7 * i + 7]
        qx, kx, vx = (dense_product(x, w, dt) for w in (q, k, v))
        # o waits for q, k and v, as after attention (a row mean: no work worth counting)
        a = qx + (kx.mean(-1, keepdims=True) + vx.mean(-1, keepdims=True))
        h = x + dense_product(a, o, dt)
        x = h + dense_product(dense_product(h, g, dt) * dense_product(h, u, dt), d, dt)
    _, head = steps[-1]
    if config.tie_word_embeddings:
        logits = tied_logits(x, head.astype(dt))
    else:
        logits = dense_product(x, head, dt)
    return logits.astype(jnp.float32)


@contextlib.contextmanager
def attention_as(attend):
    """Inside, ``llama.attend`` is ``attend`` (``None``: left as it is); jax's caches are cleared
    on the way in and out (the layers' inner ``jit`` would otherwise reuse a trace made under
    the other form). """
    import jax

    from dsbd_jax.models import llama
    current = llama.attend
    jax.clear_caches()
    if attend is not None:
        llama.attend = attend
    try:
        yield
    finally:
        llama.attend = current
        jax.clear_caches()


def without_attention():
    """While inside, ``llama.attend`` returns its queries (the shape of its output), so a pass
    traced inside runs everything but its attention (:func:`attention_as`, which
    clears jax's caches around it)."""
    return attention_as(lambda q, keys, values, mask, scale, cap=None: q)


def tracing(name: str):
    """The context a program is traced in: :func:`without_attention` for ``no_attention``."""
    return without_attention() if name == "no_attention" else contextlib.nullcontext()


def programs(config, params, B, T, slots, seed=0):
    """``{"floor": (fn, args), "pass": (fn, args)}`` over ``[B, T]`` new tokens: :func:`floor`
    of random float32 rows, and the whole forward over ``slots`` cached slots as
    ``_drafts.pass_call`` runs it (empty cache, all-ones mask, positions ``slots - T ..``,
    logits at every new token). Each ``fn`` is the plain function; :func:`jitted` compiles it as
    the decoders do."""
    import jax
    import jax.numpy as jnp
    from dsbd_jax.models.cache import empty_cache
    from dsbd_jax.models.llama import forward
    x = jax.random.normal(jax.random.PRNGKey(seed), (B, T, config.hidden_size), jnp.float32)
    positions = jnp.broadcast_to(slots - T + jnp.arange(T, dtype=jnp.int32), (B, T))
    mask = jnp.ones((B, T, slots + T), bool)
    whole = (lambda p, c, t: forward(config, p, t, positions, mask, c)[0],
             (params, empty_cache(config, B, slots), jnp.ones((B, T), jnp.int32)))
    # no_attention: the same pass, traced under without_attention() (tracing)
    return {"floor": (lambda p, x: floor(config, p, x), (params, x)),
            "pass": whole, "no_attention": whole}


def in_context(measure, name, fn, args) -> int:
    """``measure(fn, *args)`` (:func:`count_dots`, :func:`dot_flops`) of a program, traced in
    its :func:`tracing` context."""
    with tracing(name):
        return measure(fn, *args)


def dots_of(name, fn, args) -> int:
    """:func:`count_dots` of a program, traced in its :func:`tracing` context."""
    return in_context(count_dots, name, fn, args)


def flops_of(name, fn, args) -> int:
    """:func:`dot_flops` of a program, traced in its :func:`tracing` context."""
    return in_context(dot_flops, name, fn, args)


def compiled(name, fn, args):
    """``fn`` compiled for ``args`` as :func:`jitted` compiles it, traced in its
    :func:`tracing` context."""
    with tracing(name):
        return jitted(fn).lower(*args).compile()


def jitted(fn):
    """``fn`` under ``cpu_options.tuned_jit``: compiled under the host's XLA:CPU options for the
    kernels among its arguments (both programs get the same, from the same parameter tree)."""
    from dsbd_jax.host.cpu_options import tuned_jit
    return tuned_jit(fn)


def sum_over_dots(fn, args, value, per_step: bool) -> int:
    """``value(eqn)`` summed over the ``dot_general`` equations of ``fn``'s jaxpr, inner jaxprs
    (``jnp.einsum``'s jit, a scan's body) included; with ``per_step`` a ``scan``'s body counts
    ``length`` times (what runs), else once (what is written)."""
    import jax

    def walk(jaxpr):
        n = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                n += value(eqn)
            times = int(eqn.params.get("length", 1)) if (
                per_step and eqn.primitive.name == "scan") else 1
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (list, tuple)) else [v]):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        n += times * walk(inner)
        return n
    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def count_dots(fn, *args) -> int:
    """The ``dot_general`` equations in ``fn``'s jaxpr, inner jaxprs (``jnp.einsum``'s jit)
    included."""
    return sum_over_dots(fn, args, lambda eqn: 1, per_step=False)


def dot_flops(fn, *args) -> int:
    """The floating-point operations of the ``dot_general`` equations in ``fn``'s jaxpr, inner
    jaxprs included (a ``scan``'s body counted ``length`` times): ``2 x`` the output's elements
    ``x`` the contracted size of each."""
    import numpy as np

    def flops(eqn):
        (contract, _), _ = eqn.params["dimension_numbers"]
        a = eqn.invars[0].aval.shape
        return 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(
            np.prod([a[i] for i in contract]))
    return sum_over_dots(fn, args, flops, per_step=True)


def rates(ms, gflop) -> dict:
    """What a row's products compute and how fast: ``floor_gflop`` and ``attention_gflop``
    (the pass's products less the pass without attention's: its scores and values products),
    ``attention_flop_share`` (of the floor's), and each one's rate in GFLOP/s:
    ``floor_gflop_per_s`` over ``floor_ms``, ``attention_gflop_per_s`` over ``pass_ms -
    no_attention_ms`` (what the attention costs in place)."""
    att = gflop["pass"] - gflop["no_attention"]
    att_ms = ms["pass"] - ms["no_attention"]
    return {"floor_gflop": gflop["floor"], "attention_gflop": att,
            "attention_flop_share": att / gflop["floor"],
            "floor_gflop_per_s": gflop["floor"] / ms["floor"] * 1e3,
            "attention_gflop_per_s": att / att_ms * 1e3 if att_ms > 0 else None}


_KIND = re.compile(r"\bkind=(k\w+)")
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(")


def hlo_ops(text: str) -> dict:
    """``{opcode: count}`` of the entry computation of a compiled program's HLO text
    (``.lower(...).compile().as_text()``): its top-level instructions, a fusion counted once under
its kind (``fusion kCustom``: on XLA:CPU a product handed to YNNPACK, a ``ynn_fusion``;
``fusion kLoop``: elementwise work and reductions)."""
    entry, ops = False, collections.Counter()
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            entry = True
            continue
        if entry:
            if line.startswith("}"):
                break
            m = _OP.match(line)
            if m:
                kind = _KIND.search(line) if m.group(1) == "fusion" else None
                ops[m.group(1) + (f" {kind.group(1)}" if kind else "")] += 1
    return dict(sorted(ops.items()))


def build_params(config, form: str, seed: int = 0):
    """Random parameters of ``config`` (its dtype) in the per-layer layout with the projection
    kernels in ``form``, as ``load_model`` stores them (``pass_probe.random_params``);
    ``int8``: every projection and the head as ``weights.Int8``, as ``load_model(...,
    weights="int8")`` stores them (``kinds.int8_params_``; a tied head untied: use
    :func:`config_for` for its config)."""
    from dsbd_jax.host.pass_probe import random_params
    if form == "int8":
        from dsbd_jax.models import kinds
        return kinds.int8_params_(random_params(config, "plain", seed), config)[0]
    return random_params(config, form, seed)


def config_for(config, form: str):
    """The config a pass over :func:`build_params`' tree in ``form`` runs with (``int8``: the
    head untied, ``kinds.int8_config``)."""
    if form == "int8":
        from dsbd_jax.models import kinds
        return kinds.int8_config(config)
    return config


def resolve_form(config, form: str) -> str:
    """``form``, or for ``host`` the form ``load_model`` picks for ``config`` on this host."""
    if form != "host":
        return form
    from dsbd_jax.host import forms
    return forms.choose_form(config, config.dtype)


def table(results) -> str:
    """The Markdown table of a run's ``results``."""
    lines = ["| model | dtype | form | new tokens | B x T | floor ms | pass ms | pass / floor "
             "| no attention ms | no attention / floor | attention GFLOP / floor's "
             "| floor GFLOP/s | attention GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    num = lambda r, k, f: "" if r.get(k) is None else format(r[k], f)
    for model, by_dtype in results.items():
        for dtype, by_form in by_dtype.items():
            for form, rec in by_form.items():
                for n, r in rec["rows"].items():
                    lines.append(f"| {model} | {dtype} | {form} | {n} | {r['B']} x {r['T']} "
                                 f"| {r['floor_ms']:.2f} | {r['pass_ms']:.2f} "
                                 f"| {r['pass_over_floor']:.2f} "
                                 f"| {r.get('no_attention_ms', float('nan')):.2f} "
                                 f"| {r.get('no_attention_over_floor', float('nan')):.2f} "
                                 f"| {num(r, 'attention_flop_share', '.3f')} "
                                 f"| {num(r, 'floor_gflop_per_s', '.0f')} "
                                 f"| {num(r, 'attention_gflop_per_s', '.0f')} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                    choices=["float32", "bfloat16"])
    ap.add_argument("--forms", nargs="+", default=["host"],
                    choices=["host", "plain", "transposed", "int8"],
                    help="kernel forms: host = what load_model picks here (forms.choose_form)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 12, 16, 32, 64],
                    help="new tokens per pass")
    ap.add_argument("--shape", default="auto", choices=["auto", "rows", "tokens"],
                    help=f"auto: up to {ROWS_UP_TO} as rows of one token [n, 1], more as one "
                         f"row of tokens [1, n]")
    ap.add_argument("--slots", type=int, default=512, help="KV-cache slots of the pass")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--hlo", action="store_true",
                    help="also record each compiled program's entry instruction counts")
    ap.add_argument("--small", action="store_true",
                    help="tiny shapes (hidden 64, 2 layers, vocabulary 512): checks the script")
    ap.add_argument("--out", default="/tmp/dsbd_pass_floor.json")
    args = ap.parse_args(argv)

    import jax
    from benchmarks._drafts import interleaved_medians
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.models.config import ModelConfig
    from dsbd_jax.host.cpu_options import options_of

    shapes = SMALL_MODELS if args.small else MODELS
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "models": {m: shapes[m] for m in args.models}, "results": {}}
    for model in args.models:
        for dtype in args.dtypes:
            config = ModelConfig(**shapes[model], dtype=dtype)
            for asked in args.forms:
                form = resolve_form(config, asked)
                by_form = out["results"].setdefault(model, {}).setdefault(dtype, {})
                if form in by_form:  # host picked a form also asked for by name
                    continue
                params = build_params(config, form)
                config_f = config_for(config, form)
                B0, T0, _ = shape_of(args.rows[0], args.shape)
                rec = {"asked": asked, "options": options_of(params),
                       "products": product_list(config_f, params),
                       "dots": {k: dots_of(k, fn, a) for k, (fn, a) in
                                programs(config_f, params, B0, T0, args.slots).items()},
                       "rows": {}}
                rec["num_products"] = len(rec["products"])
                for n in args.rows:
                    B, T, shape = shape_of(n, args.shape)
                    progs = programs(config_f, params, B, T, args.slots)
                    calls, first, hlo = {}, {}, {}
                    for k, (fn, a) in progs.items():  # compile + one run, apart from the medians
                        t0 = time.perf_counter()
                        program = compiled(k, fn, a)
                        calls[k] = functools.partial(program, *a)
                        jax.block_until_ready(calls[k]())
                        first[k] = time.perf_counter() - t0
                        if args.hlo:
                            hlo[k] = hlo_ops(program.as_text())
                    ms = interleaved_medians(calls, args.repeats)
                    r = {"B": B, "T": T, "shape": shape, "floor_ms": ms["floor"],
                         "pass_ms": ms["pass"], "pass_over_floor": ms["pass"] / ms["floor"],
                         "pass_minus_floor_ms": ms["pass"] - ms["floor"],
                         "no_attention_ms": ms["no_attention"],
                         "no_attention_over_floor": ms["no_attention"] / ms["floor"],
                         "first_call_s": first}
                    r.update(rates(ms, {k: flops_of(k, fn, a) / 1e9
                                        for k, (fn, a) in progs.items()}))
                    if args.hlo:
                        r["hlo_ops"] = hlo
                    rec["rows"][str(n)] = r
                    by_form[form] = rec
                    write_json(args.out, out)  # after every row count: a cut-off run keeps them
                    print(f"{model} {dtype} {form} {n} ({B}x{T}): floor {ms['floor']:.2f} ms, "
                          f"pass {ms['pass']:.2f} ms, {r['pass_over_floor']:.2f}x; without attention "
                          f"{r['no_attention_over_floor']:.2f}x; attention "
                          f"{r['attention_flop_share']:.3f} of the floor's GFLOP", flush=True)
                    del progs, calls
                by_form[form] = rec
                del params
    write_json(args.out, out)
    print("\n" + table(out["results"]))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
