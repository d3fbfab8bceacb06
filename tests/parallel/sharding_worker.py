"""The sharded-decoding checks, run by ``tests/parallel/test_sharding.py`` in a subprocess with 8 virtual
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``), so the rest of the suite
keeps one device. Writes one JSON file; the tests assert on it.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/parallel/sharding_worker.py TMP OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np

from dsbd_jax import load_model
from dsbd_jax import parallel as sh
from dsbd_jax.eval import hlo as hlo_text
from dsbd_jax.parallel.rules import model_configs, path_keys
from dsbd_jax.decoding.methods import build, model_params
from dsbd_jax.testing import make_tiny_pair

SETTINGS = dict(max_new_tokens=6, top_k=10, top_p=0.8, eos_token_id=())
METHOD_SETTINGS = {
    "sample": dict(),
    "beam": dict(num_beams=2),
    "beam_search": dict(num_beams=2),
    "spec": dict(gamma=2),
    "tree": dict(gamma=2, tree_widths=(2, 1)),
    "dsbd": dict(gamma=2, draft_width=3, threshold=0.9, min_width=1, node_budget=13),  # 5 per layer
}
# (method, (data, model), uneven_batch): every decoder on the (2, 4) mesh (a batch of 3 that does
# not divide the data axis, KV heads 2 that do not divide the model axis); DSBD on every mesh
CASES = [
    ("dsbd", (8, 1), "pad"), ("dsbd", (2, 4), "pad"), ("dsbd", (1, 2), "pad"),
    ("sample", (2, 4), "pad"), ("sample", (2, 4), "replicate"), ("beam", (2, 4), "pad"),
    ("beam_search", (2, 4), "pad"), ("spec", (2, 4), "pad"), ("tree", (2, 4), "pad"),
    ("tree", (1, 2), "pad"), ("sample", (1, 8), "pad"),
]
# the cases above run on the weight layout load_model picks here (per-layer on CPU); these run
# on the other one as well
STACKED_CASES = [("dsbd", (2, 4), "pad"), ("beam", (2, 4), "pad")]


def leaves_with_names(out):
    return [(jax.tree_util.keystr(p), np.asarray(x))
            for p, x in jax.tree_util.tree_flatten_with_path(out)[0]]


def compare(ref, out):
    """Names of the outputs that differ (log-likelihoods and float stats: allclose)."""
    bad = []
    for (name, a), (_, b) in zip(leaves_with_names(ref), leaves_with_names(out)):
        if a.shape != b.shape:
            bad.append(f"{name} shape {a.shape} vs {b.shape}")
        elif np.issubdtype(a.dtype, np.floating):
            if not np.allclose(a, b, rtol=1e-5, atol=1e-4, equal_nan=True):
                bad.append(name)
        elif not np.array_equal(a, b):
            bad.append(name)
    return bad


def per_layer_check(target, mesh_shapes):
    """The rules on both layouts of one tree: per-layer (``layers_<i>``, no layer axis) against
    stacked (``layers`` with a replicated leading axis)."""
    from dsbd_jax.models.llama import convert_layout
    p = convert_layout(target.params, "stacked")
    L = target.config.num_layers
    per_layer = convert_layout(target.params, "per_layer")
    out = []
    for shape in mesh_shapes:
        rules = sh.ShardingRules(sh.make_mesh(*shape))
        stacked = rules.param_specs(target.config, p)
        specs = rules.param_specs(target.config, per_layer)
        placed = jax.device_put(per_layer, rules.param_shardings(target.config, per_layer))
        ok = all(tuple(specs[f"layers_{i}"]["attn"]["q_proj"]["kernel"])
                 == tuple(stacked["layers"]["attn"]["q_proj"]["kernel"])[1:] for i in range(L))
        same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                            per_layer, jax.device_get(placed))
        flat = {"/".join(path_keys(k)): str(v)
                for k, v in jax.tree_util.tree_flatten_with_path(
                    specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]}
        out.append(dict(mesh=list(shape), matches_stacked=bool(ok),
                        values_kept=all(jax.tree.leaves(same)), specs=flat))
    return out


def main(tmp, out_path):
    t_start = time.time()
    assert jax.device_count() == 8, jax.devices()
    tdir, ddir = make_tiny_pair(tmp)
    target, draft = load_model(tdir), load_model(ddir, tokenizer=False)
    rng = np.random.RandomState(0)
    ids = rng.randint(4, 200, size=(3, 16)).astype(np.int32)
    lens = np.array([16, 9, 12], np.int32)
    ids2 = rng.randint(4, 200, size=(3, 16)).astype(np.int32)   # same bucket, other prompts
    lens2 = np.array([5, 16, 11], np.int32)
    key = jax.random.key(7)
    refs, results = {}, []
    from dsbd_jax.models.llama import convert_layout, params_layout
    layouts = {params_layout(target.params): (target.params, draft.params)}
    other = "stacked" if "per_layer" in layouts else "per_layer"
    layouts[other] = (convert_layout(target.params, other), convert_layout(draft.params, other))
    default = params_layout(target.params)
    for method, shape, uneven, layout in ([c + (default,) for c in CASES]
                                          + [c + (other,) for c in STACKED_CASES]):
        t0 = time.time()
        dec = build(method, target.config, draft.config, **SETTINGS, **METHOD_SETTINGS[method])
        params = model_params(dec, *layouts[layout])
        if method not in refs:
            refs[method] = jax.device_get(dec(params, ids, key, prompt_lengths=lens))
        mesh = sh.make_mesh(*shape)
        sdec = sh.ShardedDecoder.of(dec, mesh, uneven_batch=uneven)
        placed = sdec.place(params)
        out = jax.device_get(sdec(placed, ids, key, prompt_lengths=lens))
        sdec(placed, ids2, key, prompt_lengths=lens2)      # same bucket: no new compile
        hlo = sdec.compiled(placed, ids, key, prompt_lengths=lens).as_text()   # the one that ran
        rep = hlo_text.loop_collectives(hlo)
        d, m = shape
        split = (uneven == "pad") or len(ids) % d == 0
        Bp = -(-len(ids) // d) * d if uneven == "pad" else len(ids)
        state5 = [dims for dt, dims in rep["loop_state_shapes"] if len(dims) == 5 and dt == "f32"]
        heads = {k: sdec.rules.axis_map(mc, k)["kv_heads"] is not None
                 for k, mc in model_configs(sdec.config).items()}
        K = sdec.config.target.num_kv_heads          # after any KV-head repetition
        rows = dec.config.num_beams if method in ("sample", "beam", "beam_search") else 1
        expect_b = (Bp // d if split else Bp) * rows     # cache rows per device
        expect_k = K // m if all(heads.values()) else K
        global_caches = [(L, Bp * rows, S, K, D) for (L, b, S, k, D) in state5]
        bad = hlo_text.gathered_weights_or_caches(rep, placed, global_caches, mesh)
        results.append(dict(
            method=method, mesh=list(shape), uneven=uneven, layout=layout,
            mismatches=compare(refs[method], out),
            compiles=sdec.compiles, notes=list(sdec.rules.notes), kv_repeat=sdec.kv_repeat,
            decode_loops=rep["decode_loops"], bytes_per_iteration=rep["bytes_per_iteration"],
            collectives=[dict(op=o["op"], result=[list(x[1]) for x in o["result_shapes"]],
                              bytes=o["bytes"], count=o["count"]) for o in rep["ops"]],
            forbidden=[dict(op=o["op"], what=o["what"]) for o in bad],
            cache_state_shapes=[list(s) for s in state5],
            expected_cache_batch=expect_b, expected_cache_heads=expect_k,
            param_bytes_per_device=sdec.param_bytes_per_device(placed),
            seconds=round(time.time() - t0, 1)))
        print(json.dumps({k: results[-1][k] for k in ("method", "mesh", "uneven", "layout",
                                                      "mismatches",
                                                      "compiles", "bytes_per_iteration",
                                                      "forbidden", "seconds")}), flush=True)
    # the command line: dsbd generate --mesh data=2,model=4
    import contextlib
    import io
    from dsbd_jax.cli import main as cli_main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli_main(["generate", "--target", str(tdir), "--draft", str(ddir), "--prompt", "hi",
                         "--prompt", "hello", "--prompt", "x", "--method", "beam", "--beams", "2",
                         "--max-new-tokens", "4", "--no-progress", "--mesh", "data=2,model=4"])
    cli = dict(code=code, out=buf.getvalue())
    strict_error = None
    try:
        sh.ShardingRules(sh.make_mesh(1, 8), strict=True).axis_map(target.config, "target")
    except ValueError as e:
        strict_error = str(e)
    report = dict(cases=results, cli=cli, per_layer=per_layer_check(target, [(2, 4), (1, 2)]),
                  strict_error=strict_error, int8_draft=int8_draft_case(target, draft, ids, lens,
                                                                        key),
                  seconds=round(time.time() - t_start, 1))
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


def int8_draft_case(target, draft, ids, lens, key):
    """DSBD with an int8 draft on a (2, 4) mesh against its one-device run: the draft stays int8
    on the mesh (codes split along the plain kernel's axes, KV heads repeated in codes and
    scales alike)."""
    from dsbd_jax.models import weights
    from dsbd_jax.models import kinds
    dp, dc = kinds.int8_params(draft.params, draft.config)
    dec = build("dsbd", target.config, dc, **SETTINGS, **METHOD_SETTINGS["dsbd"])
    params = {"target": target.params, "draft": dp}
    ref = jax.device_get(dec(params, ids, key, prompt_lengths=lens))
    sdec = sh.ShardedDecoder.of(dec, sh.make_mesh(2, 4), uneven_batch="pad")
    placed = sdec.place(params)
    out = jax.device_get(sdec(placed, ids, key, prompt_lengths=lens))
    up = placed["draft"]["layers_0"]["mlp"]["up_proj"]["kernel"]
    k = placed["draft"]["layers_0"]["attn"]["k_proj"]["kernel"]
    return dict(mismatches=compare(ref, out), kind=type(up).__name__,
                up_codes_spec=str(up.codes.sharding.spec),
                up_scales_spec=str(up.scales.sharding.spec), kv_repeat=sdec.kv_repeat,
                k_codes_shape=list(k.codes.shape), k_scales_shape=list(k.scales.shape),
                draft_kv_heads=sdec.config.draft.num_kv_heads,
                head_dim=sdec.config.draft.head_dim,
                int8_leaves=sum(isinstance(x, weights.Int8)
                                for x in weights.leaves(placed["draft"])))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1], sys.argv[2])
