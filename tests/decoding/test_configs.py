"""One config per decoder: each has the fields its decoder reads (the settings the command line
and the harness may give it), and each decoder takes its own config and refuses the others."""

import dataclasses

import jax
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax import (BeamSampleConfig, BeamSearchConfig, DSBDConfig, SampleConfig,
                      SpeculativeConfig, TreeConfig, beam_sample, beam_search, dsbd_generate,
                      sample, speculative_sample, tree_speculative_sample)
from dsbd_jax.decoding import configs, methods

SHARED = {"target", "max_new_tokens", "temperature", "top_k", "top_p", "eos_token_id",
          "pad_token_id", "progress", "options"}
OWN = {SampleConfig: {"num_beams"}, BeamSampleConfig: {"num_beams", "replacement"},
       BeamSearchConfig: {"num_beams", "length_penalty", "early_stopping"},
       SpeculativeConfig: {"draft", "gamma"},
       TreeConfig: {"draft", "gamma", "tree_widths", "replacement"},
       DSBDConfig: {"draft", "gamma", "num_beams", "replacement", "draft_width", "threshold",
                    "min_width", "max_width", "single_beam", "node_budget"}}
DECODERS = {sample: SampleConfig, beam_sample: BeamSampleConfig, beam_search: BeamSearchConfig,
            speculative_sample: SpeculativeConfig, tree_speculative_sample: TreeConfig,
            dsbd_generate: DSBDConfig}


def test_each_config_has_the_shared_fields_and_its_decoders_own():
    for cls, own in OWN.items():
        assert {f.name for f in dataclasses.fields(cls)} == SHARED | own, cls.__name__
    # the command line's and harness's settings of a method are its config's fields
    for method, cls in (("sample", SampleConfig), ("beam", BeamSampleConfig),
                        ("beam_search", BeamSearchConfig), ("spec", SpeculativeConfig),
                        ("tree", TreeConfig), ("dsbd", DSBDConfig)):
        assert methods.allowed(method) == (SHARED | OWN[cls]) - {"target", "draft"}
        assert methods.config_class(method) is cls
    with pytest.raises(ValueError, match="has no setting"):
        methods.build("sample", ref.toy_model(vocab=12)[0], replacement=False)


def test_fields_after_target_are_keywords_and_kept_as_given():
    config, _ = ref.toy_model(vocab=12)
    with pytest.raises(TypeError):
        SampleConfig(config, 4)
    c = TreeConfig(config, draft=config, gamma=2, tree_widths=[3, 1], eos_token_id=[5])
    assert c.tree_widths == (3, 1) and c.eos_token_id == (5,)   # only made tuples (hashable)
    assert hash(c) == hash(TreeConfig(config, draft=config, gamma=2, tree_widths=(3, 1),
                                      eos_token_id=(5,)))
    d = DSBDConfig(config, draft=config, max_width=None, eos_token_id=None)
    assert d.max_width is None and d.eos_token_id is None and d.beam_width == d.draft_width
    with pytest.raises(ValueError, match="needs a draft"):
        DSBDConfig(config)
    with pytest.raises(TypeError):
        SpeculativeConfig(config)                  # its draft is required
    with pytest.raises(ValueError, match="tree_widths must be 2"):
        TreeConfig(config, draft=config, gamma=2, tree_widths=(1,))
    with pytest.raises(ValueError, match="num_beams"):
        BeamSampleConfig(config, num_beams=0)


def _run(fn, params, pair, config, ids, lens):
    key = jax.random.key(4)
    p = pair if getattr(config, "draft", None) is not None else params
    if fn is beam_search:
        return fn(p, ids, config, prompt_lengths=lens)
    return fn(p, ids, key, config, prompt_lengths=lens)


@pytest.mark.parametrize("fn", [  # CI: a drafted and a plain decoder; the others extended
    pytest.param(f, id=f.__name__, marks=() if f.__name__ in ("dsbd_generate", "sample")
                 else pytest.mark.extended) for f in DECODERS])
def test_a_decoder_takes_its_own_config_and_refuses_others(fn):
    config, params = ref.toy_model(vocab=16)
    pair = {"target": params, "draft": params}
    ids, lens = np.array([[1, 2, 3], [4, 5, 0]], np.int32), np.array([3, 2], np.int32)
    own_cls = DECODERS[fn]
    kw = dict(max_new_tokens=3, top_k=5, eos_token_id=())
    extra = {"num_beams": 2} if "num_beams" in OWN[own_cls] else {}
    if "draft" in OWN[own_cls]:
        extra.update(draft=config, gamma=2)
    own = own_cls(config, **kw, **extra)
    _run(fn, params, pair, own, ids, lens)
    for other_cls in OWN:
        if other_cls is own_cls:
            continue
        fields = {f.name for f in dataclasses.fields(other_cls)}
        given = {k: v for k, v in extra.items() if k in fields}
        if "draft" in fields:
            given["draft"] = config
        other = other_cls(config, **kw, **given)
        with pytest.raises(ValueError, match=f"{fn.__name__} takes a {own_cls.__name__}"):
            _run(fn, params, pair, other, ids, lens)
    assert configs.ACCEPTS[fn.__name__] == (own_cls,)   # its own config only


def test_the_configs_do_not_warn():
    """The per-decoder configs never warn, nor does the library when it builds a decoder."""
    import warnings
    config, _ = ref.toy_model(vocab=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for method in ("sample", "beam", "beam_search", "spec", "tree", "dsbd"):
            methods.build(method, config, config if method in ("spec", "tree", "dsbd")
                          else None)
        SampleConfig(config, num_beams=2)
