"""A 16-bit embedding table is never converted whole: the decoders' compiled programs gather
its rows as bits and cast only those (models.llama.embed_rows). A bfloat16 gather made XLA:CPU
convert the whole [V, d] table to float32 inside DSBD's and speculative sampling's loops (on
the offline Qwen pair in bfloat16: both tables, 233M and 136M entries, every iteration)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax import DSBDConfig, SpeculativeConfig, dsbd_generate, speculative_sample
from dsbd_jax.models import head as mhead
from dsbd_jax.models import llama
from dsbd_jax.models.config import ModelConfig

CFG = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=16, dtype="bfloat16",
                  tie_word_embeddings=False)   # an untied head: the table is read by the lookup only


def whole_table_converts(text: str, cfg: ModelConfig):
    shape = f"f32[{cfg.vocab_size},{cfg.hidden_size}]"
    return [line.strip()[:160] for line in text.splitlines()
            if re.search(rf"= {re.escape(shape)}\S* (convert|fusion)\(", line)
            and "embed" in line]


def whole_table_copies(text: str, cfg: ModelConfig):
    """A whole ``uint16`` view of the table made on its own (a copy, e.g. hoisted out of the
    loop), not fused into the gather that reads its rows."""
    shape = re.escape(f"u16[{cfg.vocab_size},{cfg.hidden_size}]")
    return [line.strip()[:160] for line in text.splitlines()
            if re.search(rf"= {shape}\S* (fusion|copy)\(", line)
            or (re.search(r"= \(.*" + shape, line) and "tuple(" in line)]


@pytest.fixture(scope="module")
def params():
    t = llama.init_params(CFG, jax.random.PRNGKey(0))
    d = llama.init_params(CFG, jax.random.PRNGKey(1))
    assert t["embed"]["embedding"].dtype == jnp.bfloat16
    return t, d


def test_dsbd_and_speculative_gather_rows_in_bfloat16(params):
    t, d = params
    ids = np.ones((1, 8), np.int32)
    key = jax.random.PRNGKey(2)
    warp = dict(max_new_tokens=6, top_k=10, top_p=0.8, eos_token_id=())
    calls = [dsbd_generate.prepare({"target": t, "draft": d}, ids, key, DSBDConfig(
                 target=CFG, draft=CFG, gamma=2, draft_width=4, threshold=0.7, min_width=2,
                 **warp)),
             speculative_sample.prepare({"target": t, "draft": d}, ids, key, SpeculativeConfig(
                 target=CFG, draft=CFG, gamma=3, **warp))]
    for call in calls:
        text = call.compile().as_text()
        assert "embed" in text
        assert not whole_table_converts(text, CFG), whole_table_converts(text, CFG)
        assert not whole_table_copies(text, CFG), whole_table_copies(text, CFG)


def test_head_forward_gathers_rows_in_bfloat16(params):
    t, _ = params
    hc = mhead.HeadConfig(CFG, intermediate_size=32)
    hp = mhead.init_params(hc, jax.random.PRNGKey(3), target_params=t)
    ids = np.ones((1, 8), np.int32)
    call = dsbd_generate.prepare({"target": t, "draft": hp}, ids, jax.random.PRNGKey(4),
                                 DSBDConfig(target=CFG, draft=hc, max_new_tokens=6, gamma=2,
                                            draft_width=3, eos_token_id=()))
    text = call.compile().as_text()
    assert not whole_table_converts(text, CFG), whole_table_converts(text, CFG)
    assert not whole_table_copies(text, CFG), whole_table_copies(text, CFG)
