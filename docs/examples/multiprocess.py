"""DSBD over several processes: one global mesh over every process's devices, each process
decoding its own prompts. Start one copy per process (docs/multiprocess.md):

    .venv/bin/python docs/examples/multiprocess.py TARGET DRAFT

with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set; without them it runs
as one process over the local devices (the same output, every row in one process).
"""
import sys

from dsbd_jax.parallel import distributed

distributed.initialize()  # first, before anything else touches JAX; False without the variables

import jax  # noqa: E402

from dsbd_jax import DSBDConfig, dsbd_generate, load_model, pad_prompts  # noqa: E402
from dsbd_jax.eval.datasets import encode_chat  # noqa: E402
from dsbd_jax.loading.load import read_config  # noqa: E402
from dsbd_jax.parallel import ShardedDecoder, make_mesh  # noqa: E402

target_path, draft_path = sys.argv[1], sys.argv[2]
# the configs alone (no weights yet), in the dtype load_model picks on this host
config = DSBDConfig(target=read_config(target_path, "auto"), draft=read_config(draft_path, "auto"),
                    max_new_tokens=16, gamma=2, draft_width=2, threshold=0.9, min_width=1)
mesh = make_mesh(model=2)  # every process's devices: model=2, data = the rest
dec = ShardedDecoder(dsbd_generate, config, mesh)
# each tensor goes onto this process's shards as it is read: no process holds the whole model
target = load_model(target_path, place=dec.placer("target"))
draft = load_model(draft_path, place=dec.placer("draft"), tokenizer=False)
params = dec.place({"target": target.params, "draft": draft.params})

# each process passes its own prompts (here: its share of one list; any count, 0 included),
# padded to the same width on every process
texts = ["Write quicksort in Python.", "What is 17 * 23?", "Name three prime numbers.",
         "Say hello."]
mine = texts[distributed.process_share(len(texts))]
ids, lengths = pad_prompts(encode_chat(target.tokenizer, mine), length=64)
out = dec(params, ids, jax.random.key(0), prompt_lengths=lengths)  # numpy: this process's rows
for text, seqs, lens, best in zip(mine, out.sequences, out.lengths, out.best):
    completion = target.tokenizer.decode(seqs[best, :lens[best]], skip_special_tokens=True)
    print(f"process {jax.process_index()}: {text!r} -> {completion!r}", flush=True)
