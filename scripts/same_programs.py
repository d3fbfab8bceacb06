"""Whether two checkouts of dsbd-jax compile the same programs: forward passes in every kernel
form (plain, transposed; float32 and bfloat16; a bfloat16 head stored as rows) and the
programs of sampling, beam sampling, speculative, tree and DSBD decoding (transposed kernels;
in bfloat16 with the head as rows), and the sharded programs of sampling, beam search and DSBD
(``ShardedDecoder`` on a 2 x 2 mesh of virtual CPU devices), on a small random model. Each checkout runs in its own process; the optimized
HLO texts are compared after dropping what names them rather than what they compute (source
metadata, and the entry parameters' names, which follow the parameter tree's keys). Same
programs run at the same speed: a refactor that leaves every program unchanged needs no timing.

    python scripts/same_programs.py --old ../old-checkout [--new .] [--out same_programs.json]

Exit status 0 when every program is the same, 1 otherwise (the first differing lines printed).
Instruction names are compared by order of first appearance: a program whose instructions only
number otherwise (the same operations traced through other Python) is the same, and is named.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DUMP = r'''
import sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models import llama
try:
    from dsbd_jax.models import kinds  # 0.3.0 on
except ImportError:
    from dsbd_jax.models import kernels as kinds  # a checkout before the rooms
from dsbd_jax.models.cache import empty_cache
from dsbd_jax import (BeamSampleConfig, DSBDConfig, SampleConfig, SpeculativeConfig, TreeConfig,
                      beam_sample, dsbd_generate, sample,
                      speculative_sample, tree_speculative_sample)

out = Path(sys.argv[1])
for dtype in ("float32", "bfloat16"):
    c = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype,
                    tie_word_embeddings=False)
    p = llama.convert_layout(llama.init_params(c, jax.random.key(0)), "per_layer")
    p = jax.tree.map(lambda x: x.astype(dtype), p)
    trees = {"plain": p, "transposed": kinds.transpose_params(p, kinds.transposed_widths(c))}
    if dtype == "bfloat16":
        trees["rows"] = kinds.transpose_head(trees["transposed"])
    B, T, S = 2, 5, 16
    args = (jnp.zeros((B, T), jnp.int32), jnp.zeros((B, T), jnp.int32),
            jnp.ones((B, T, S + T), bool), empty_cache(c, B, S))
    for name, tree in trees.items():
        f = jax.jit(lambda p, t, ps, m, ca: llama.forward(c, p, t, ps, m, ca))
        (out / f"forward-{dtype}-{name}.hlo").write_text(f.lower(tree, *args).compile().as_text())
    tree = trees["rows" if dtype == "bfloat16" else "transposed"]
    pair = {"target": tree, "draft": tree}
    ids, key = np.ones((1, 4), np.int32), jax.random.key(0)
    base = dict(target=c, max_new_tokens=4, top_k=10, top_p=0.8)
    calls = {
        "dsbd": dsbd_generate.prepare(pair, ids, key, DSBDConfig(
            draft=c, gamma=2, draft_width=2, threshold=0.7, **base)),
        "sample": sample.prepare(tree, ids, key, SampleConfig(**base)),
        "beam_sample": beam_sample.prepare(tree, ids, key, BeamSampleConfig(num_beams=2, **base)),
        "speculative": speculative_sample.prepare(pair, ids, key,
                                                  SpeculativeConfig(draft=c, gamma=2, **base)),
        "tree": tree_speculative_sample.prepare(pair, ids, key, TreeConfig(
            draft=c, gamma=2, tree_widths=(2, 2), **base)),
    }
    for name, call in calls.items():
        (out / f"{name}-{dtype}.hlo").write_text(call.compile().as_text())
        (out / f"{name}-{dtype}.tokens").write_text(str(np.asarray(call().sequences).tolist()))
'''

# the sharded programs (ShardedDecoder on a 2 x 2 mesh of virtual CPU devices), in a process of
# their own: the device count is set before jax starts
DUMP_SHARDED = r'''
import sys
from pathlib import Path
import jax, numpy as np
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models import llama
from dsbd_jax import (BeamSearchConfig, DSBDConfig, SampleConfig, beam_search, dsbd_generate,
                      sample)
from dsbd_jax.parallel import ShardedDecoder, make_mesh

out = Path(sys.argv[1])
c = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=2,
                num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=False)
p = llama.convert_layout(llama.init_params(c, jax.random.key(0)), "per_layer")
pair = {"target": p, "draft": p}
ids, lens, key = np.ones((3, 4), np.int32), np.array([4, 2, 3], np.int32), jax.random.key(0)
base = dict(target=c, max_new_tokens=4, top_k=10, top_p=0.8)
cases = {"sample": (sample, SampleConfig(num_beams=2, **base), p),
         "beam_search": (beam_search, BeamSearchConfig(num_beams=2, **base), p),
         "dsbd": (dsbd_generate, DSBDConfig(draft=c, gamma=2, draft_width=2, threshold=0.7,
                                            **base), pair)}
for name, (fn, config, params) in cases.items():
    dec = ShardedDecoder(fn, config, make_mesh(2, 2))
    placed = dec.place(params)
    k = None if fn is beam_search else key
    hlo = dec.compiled(placed, ids, k, prompt_lengths=lens).as_text()
    (out / f"sharded-{name}.hlo").write_text(hlo)
    res = dec(placed, ids, k, prompt_lengths=lens)
    (out / f"sharded-{name}.tokens").write_text(str(np.asarray(res.sequences).tolist()))
'''


def normalise(text: str) -> str:
    """The program without what names it: source tables and metadata, module name, and the
    entry parameters' names (replaced by their positions)."""
    lines = [ln for ln in text.splitlines()
             if not re.match(r"^\s*\d+ |^(FileNames|FunctionNames|FileLocations|StackFrames)", ln)]
    text = "\n".join(lines)
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"stack_frame_id=\d+", "", text)
    text = re.sub(r"HloModule \S+", "HloModule", text)
    entry = text[text.find("\nENTRY"):]
    names = dict(re.findall(r"%(\S+) = [^\n]*? parameter\((\d+)\)", entry))
    for name in sorted(names, key=len, reverse=True):
        text = text.replace(f"%{name} ", f"%arg{names[name]} ").replace(
            f"{name}:", f"arg{names[name]}:").replace(f"%{name})", f"%arg{names[name]})").replace(
            f"%{name},", f"%arg{names[name]},")
    return text


def renumber(text: str) -> str:
    """``text`` with every instruction and computation name (``%name``) replaced by its order
    of first appearance: the same program traced through other Python (a jit nested in
    another, which inlines to the same instructions) numbers its instructions differently."""
    seen: dict = {}
    return re.sub(r"%[\w.\-]+|\b[A-Za-z_][\w\-]*(?:\.\d+)+\b",
                  lambda m: seen.setdefault(m.group(0), f"%i{len(seen)}"), text)


def dump(checkout: Path, folder: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()), DSBD_JAX_COMPILATION_CACHE="0")
    subprocess.run([sys.executable, "-c", DUMP, str(folder)], env=env, check=True,
                   cwd=str(checkout))
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
                        ).strip()
    subprocess.run([sys.executable, "-c", DUMP_SHARDED, str(folder)], env=env, check=True,
                   cwd=str(checkout))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, type=Path, help="the checkout to compare with")
    ap.add_argument("--new", default=Path("."), type=Path, help="this checkout (default .)")
    ap.add_argument("--out", default=None, help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old, new = Path(tmp, "old"), Path(tmp, "new")
        old.mkdir()
        new.mkdir()
        dump(args.old, old)
        dump(args.new, new)
        result, same = {}, True
        for f in sorted(old.iterdir()):
            a, b = f.read_text(), (new / f.name).read_text()
            names_only = False
            if f.suffix == ".hlo":
                a, b = normalise(a), normalise(b)
                # the same instructions traced through other Python are numbered otherwise
                # (a jit inlined in another, a step traced in another order): named, not failed
                names_only = a != b and renumber(a) == renumber(b)
                a, b = renumber(a), renumber(b)
            ok = a == b
            same &= ok
            result[f.stem + f.suffix] = {"same": ok, "names_only": names_only,
                                         "lines": len(a.splitlines()),
                                         "sha1": hashlib.sha1(b.encode()).hexdigest()[:12]}
            verdict = ("same, instructions numbered otherwise" if names_only
                       else "same" if ok else "DIFFERENT")
            print(f"{f.name:32s} {verdict} ({len(a.splitlines())} lines)")
            if not ok:
                for x, y in zip(a.splitlines(), b.splitlines()):
                    if x != y:
                        print("   old:", x[:160], "\n   new:", y[:160])
                        break
    if args.out:
        Path(args.out).write_text(json.dumps({"same": same, "programs": result}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
