"""Prompt buckets (``common.bucket_length`` / ``pad_prompts`` / ``max_prompt_length``): a prompt
that fits the models is never padded past their ``max_position_embeddings``, and the cap agrees
with the position check every decoder runs before compiling (one position more is refused)."""

import numpy as np
import pytest

from dsbd_jax.decoding import common, sampling, speculative
from dsbd_jax.decoding.configs import (BeamSampleConfig, BeamSearchConfig, DSBDConfig,
                                       SampleConfig, SpeculativeConfig, TreeConfig)

from dsbd_jax.decoding.dsbd import generate as dsbd
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.decoding.methods import build


def model(max_pos, vocab=8):
    return ModelConfig(vocab_size=vocab, hidden_size=8, intermediate_size=16, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=4, max_position_embeddings=max_pos)


def test_bucket_is_a_power_of_two_capped_at_what_fits():
    assert [common.bucket_length(n) for n in (1, 16, 17, 1000)] == [16, 16, 32, 1024]
    # the reported case: 17,000 tokens, 32,768 positions; the bucket would be 32,768
    assert common.bucket_length(17_000) == 32_768
    assert common.bucket_length(17_000, maximum=32_768 - 64 - 3) == 32_768 - 64 - 3
    assert common.bucket_length(100, maximum=32_701) == 128  # below the cap: unchanged
    assert common.bucket_length(10, maximum=12) == 12
    with pytest.raises(ValueError, match="prompt too long: 33 tokens, but at most 32 fit"):
        common.bucket_length(33, maximum=32)


def test_pad_prompts_max_length():
    ids, lens = common.pad_prompts([[1] * 17_000, [2, 3]], max_length=20_000)
    assert ids.shape == (2, 20_000) and lens.tolist() == [17_000, 2]
    assert ids[1, :3].tolist() == [2, 3, 0]
    assert common.pad_prompts([[1] * 5], max_length=100)[0].shape == (1, 16)
    with pytest.raises(ValueError, match="prompt too long"):
        common.pad_prompts([[1] * 101], max_length=100)


def host_check(dec, ids, lens):
    """The decoder's host-side input checks (they run before anything is compiled)."""
    key = np.zeros(2, np.uint32)
    if dec.method == "dsbd":
        dsbd.check_inputs({"target": None, "draft": None}, ids, dec.config, lens, key=key)
    elif dec.needs_draft:
        speculative.check_inputs({"target": {}, "draft": {}}, ids, dec.config, lens, key=key)
    else:
        sampling.check_inputs({"embed": {"embedding": np.zeros((8, 8))}}, ids, dec.config, lens)


@pytest.mark.parametrize("method, settings", [
    ("sample", {}), ("beam", {"num_beams": 2}), ("beam_search", {"num_beams": 2}),
    ("spec", {"gamma": 3}), ("tree", {"gamma": 2}),
    ("dsbd", {"gamma": 3, "draft_width": 2}), ("dsbd", {"gamma": 2, "single_beam": True}),
])
def test_max_prompt_length_is_what_the_decoders_accept(method, settings):
    dec = build(method, model(64), model(60), max_new_tokens=5, **settings)
    cap = common.max_prompt_length(dec.config)
    lookahead = settings.get("gamma", 0) + 1 if dec.needs_draft else 0
    assert cap == (60 if dec.needs_draft else 64) - 5 - lookahead
    ids, lens = common.pad_prompts([[1] * (cap - 3)], max_length=cap)
    assert ids.shape[1] == cap  # the bucket (64) was capped
    host_check(dec, ids, lens)
    with pytest.raises(ValueError, match="prompt too long"):
        host_check(dec, np.ones((1, cap + 1), np.int32), np.array([cap - 3], np.int32))


@pytest.mark.parametrize("cls", [SampleConfig, BeamSampleConfig, BeamSearchConfig,
                                 SpeculativeConfig, TreeConfig, DSBDConfig],
                         ids=lambda c: c.__name__)
def test_a_config_keeps_its_eos_as_given_and_eos_ids_applies_it(cls):
    """``eos_token_id=None`` stays ``None`` (the target's ids apply through ``eos_ids``); an int
    or a list is only made a tuple (hashable); ``()`` is no EOS at all (every decoder's config)."""
    target = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=4, eos_token_id=(3, 7))
    drafted = cls in (SpeculativeConfig, TreeConfig, DSBDConfig)

    def make(target, **kw):
        return cls(target, **kw, **({"draft": target} if drafted else {}))

    default = make(target)
    assert default.eos_token_id is None and default.eos_ids == (3, 7) and default.pad_id == 3
    assert make(target, eos_token_id=5).eos_token_id == (5,)
    given = make(target, eos_token_id=[9, 2])
    assert given.eos_token_id == (9, 2) == given.eos_ids and hash(given)
    none = make(target, eos_token_id=())
    assert none.eos_ids == () and none.pad_id == 0
    assert make(target.replace(eos_token_id=None)).eos_ids == ()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        make(target.replace(eos_token_id=(99,)))
