"""Every draft tool and every decoder on every kind of model ``load_model`` returns.

The matrix: the parameters' dtype (float32, bfloat16) x the projection kernels' form (plain
``[in, out]``, transposed ``[out / n, n, in]`` rows (a ``RowBlocks`` leaf); forced with
``$DSBD_JAX_KERNEL_FORM``, as a user forces it) x the head (tied: the embedding; untied: its own
kernel, stored as ``[V, d]`` rows (a ``Rows`` leaf) when the model is 16-bit and
transposed). Each case loads a tiny random target/draft pair written by ``transformers``
(:func:`dsbd_jax.testing.make_tiny_pair`) and runs:

* the draft tools: :func:`~dsbd_jax.models.vocab.truncate_head` (with and without prompt rows)
  gives the tree ``load_model(head_rows=...)`` gives, and its logits are the full head's on the
  rows; :func:`~dsbd_jax.models.vocab.with_prompt_rows` adds the prompt tokens;
  :func:`~dsbd_jax.models.vocab.untie_head` gives the tree ``load_model(untie_head=True)``
  gives; :func:`~dsbd_jax.models.kinds.unblock_params` gives the plain load's tree; export
  (:func:`~dsbd_jax.training.export.save_hf`) writes what loads back as the same model; one
  distillation step (:func:`~dsbd_jax.training.distill.distill`, LoRA) runs and exports;
* every decoder (``sample``, ``beam_sample``, ``speculative_sample``,
  ``tree_speculative_sample`` with a truncated draft, ``dsbd_generate`` with a truncated draft
  that adds its prompt rows, single-beam DSBD): tokens in the vocabulary, every live beam's
  log-likelihood finite and equal to the target's own log-probability of its tokens (one
  causal pass), at least one live beam per prompt.

Tiny models (hidden 32, one layer, 260 tokens), three new tokens, one draft layer, one batch
shape, so that every case compiles each program once.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.decoding.beam import beam_sample
from dsbd_jax.decoding.common import pad_prompts
from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig, SpeculativeConfig, TreeConfig
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.decoding.speculative import speculative_sample
from dsbd_jax.decoding.tree import tree_speculative_sample
from dsbd_jax.models import kinds
from dsbd_jax.host import forms
from dsbd_jax.models.llama import logits
from dsbd_jax.loading.load import load_model
from dsbd_jax.models.weights import Rows, program_kind
from dsbd_jax.models.vocab import save_table, top_rows, truncate_head, untie_head, with_prompt_rows

DTYPES = ("float32", "bfloat16")
FORMS = ("plain", "transposed")
HEADS = ("untied", "tied")
CASES = [(d, f, h) for d in DTYPES for f in FORMS for h in HEADS]
# CI runs four of the eight cells, every pair of two factors' values among them (float32 plain
# untied, float32 transposed tied, bfloat16 plain tied, bfloat16 transposed untied: the one whose
# head is stored as rows); the other four are marked extended (DSBD_TEST_EXTENDED=1)
PAIRWISE = {("float32", "plain", "untied"), ("float32", "transposed", "tied"),
            ("bfloat16", "plain", "tied"), ("bfloat16", "transposed", "untied")}
N_ROWS = 40          # rows of a truncated head (of 260)
PROMPTS = ([5, 6, 7, 8, 9, 10], [11, 12, 13], [250, 4, 60], [7])
NEW = 3              # new tokens per decoder call


@dataclasses.dataclass
class Case:
    dtype: str
    form: str
    head: str
    dirs: dict          # {"target": dir, "draft": dir}
    table: object       # the draft's vocabulary table (a path)
    target: object = None
    draft: object = None

    @property
    def id(self) -> str:
        return f"{self.dtype}-{self.form}-{self.head}"

    def load(self, which: str = "draft", form=None, dtype=None, **kw):
        """``load_model`` of this case's ``which`` model, its form forced as a user forces it."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(forms.FORM_ENV, form or self.form)
            return load_model(self.dirs[which], dtype=jnp.dtype(dtype or self.dtype),
                              progress=False, **kw)

    def rows(self):
        from dsbd_jax.models.vocab import load_table
        return top_rows(load_table(self.table)[0], N_ROWS,
                        keep=self.draft.config.eos_token_id or ())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, torch):
    """``{head: (dirs, table)}``: a tiny pair per head kind and a random frequency table."""
    from dsbd_jax.testing import make_tiny_pair
    out = {}
    for head in HEADS:
        d = tmp_path_factory.mktemp(f"pair_{head}")
        t, dr = make_tiny_pair(d, seed=0, noise=0.1, hidden_size=32, num_layers=1,
                               tie_word_embeddings=head == "tied")
        V = json.loads((t / "config.json").read_text())["vocab_size"]
        table = save_table(d / "table.npz", np.random.default_rng(1).integers(0, 1000, V))
        out[head] = ({"target": t, "draft": dr}, table)
    return out


@pytest.fixture(scope="module", params=[
    pytest.param(c, id="-".join(c), marks=() if c in PAIRWISE else pytest.mark.extended)
    for c in CASES])
def case(request, checkpoints):
    dtype, form, head = request.param
    dirs, table = checkpoints[head]
    c = Case(dtype, form, head, dirs, table)
    c.target, c.draft = c.load("target"), c.load("draft")
    # the case is the model it names
    p = c.draft.params
    assert program_kind(p)[:2] == (form, dtype), c.id
    assert ("lm_head" in p) == (head == "untied") and c.draft.config.tie_word_embeddings == \
        (head == "tied")
    if head == "untied":
        row_head = dtype == "bfloat16" and form == "transposed"
        assert isinstance(p["lm_head"]["kernel"], Rows) == row_head == c.draft.info["head_transposed"], c.id
    return c


def _same_tree(a, b, what):
    fa, fb = (jax.tree_util.tree_flatten_with_path(t)[0] for t in (a, b))
    assert [jax.tree_util.keystr(k) for k, _ in fa] == [jax.tree_util.keystr(k) for k, _ in fb], \
        what
    for (k, x), (_, y) in zip(fa, fb):
        assert x.shape == y.shape and x.dtype == y.dtype, (what, jax.tree_util.keystr(k))
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                      err_msg=f"{what}: {jax.tree_util.keystr(k)}")


def _ids():
    return np.asarray([[3, 9, 20, 200, 7], [40, 41, 42, 43, 44]], np.int32)


# ---------------------------------------------------------------------------------------------
# draft tools
@pytest.mark.parametrize("prompt_rows", [False, True], ids=["rows", "prompt_rows"])
def test_truncate_head(case, prompt_rows):
    """Truncating a loaded model gives the tree truncating at load gives, in the head's form,
    and its logits are the full model's on the rows, ``-inf`` elsewhere."""
    cfg, params, rows = case.draft.config, case.draft.params, case.rows()
    cut = truncate_head(params, cfg, rows, prompt_rows=prompt_rows)
    at_load = case.load(head_rows=N_ROWS, vocab_table=case.table, prompt_rows=prompt_rows)
    _same_tree(cut, at_load.params, f"{case.id}: truncate_head after load vs at load")
    assert program_kind(cut) == program_kind(at_load.params)
    full, part = np.asarray(logits(cfg, params, _ids())), np.asarray(logits(cfg, cut, _ids()))
    np.testing.assert_allclose(part[..., rows], full[..., rows], rtol=1e-5, atol=1e-5)
    others = np.setdiff1d(np.arange(cfg.vocab_size), rows)
    assert np.all(part[..., others] == -np.inf)


def test_prompt_rows(case):
    """A head with prompt rows, extended by a batch's prompts (under jit, as the decoders do):
    finite logits on the rows and the prompt tokens, equal to the full head's there."""
    cfg, params, rows = case.draft.config, case.draft.params, case.rows()
    cut = truncate_head(params, cfg, rows, prompt_rows=True)
    prompts = jnp.asarray([[250, 251], [252, 5]], jnp.int32)
    ext = jax.jit(with_prompt_rows)(cut, prompts)
    assert program_kind(ext) == program_kind(cut)
    full, part = np.asarray(logits(cfg, params, _ids())), np.asarray(logits(cfg, ext, _ids()))
    kept = np.union1d(rows, np.asarray(prompts).ravel())
    np.testing.assert_allclose(part[..., kept], full[..., kept], rtol=1e-5, atol=1e-5)
    assert np.all(part[..., np.setdiff1d(np.arange(cfg.vocab_size), kept)] == -np.inf)


def test_untie_head(case):
    """Untying a loaded tied model gives the tree ``load_model(untie_head=True)`` gives; an untied
    model is returned as it is."""
    params, cfg = untie_head(case.draft.params, case.draft.config)
    if case.head == "untied":
        assert params is case.draft.params and cfg is case.draft.config
        return
    _same_tree(params, case.load(untie_head=True).params, f"{case.id}: untie_head after load")
    assert not cfg.tie_word_embeddings
    # and truncated after untying, as the loader does it
    cut = truncate_head(params, cfg, case.rows(), prompt_rows=True)
    at_load = case.load(untie_head=True, head_rows=N_ROWS, vocab_table=case.table,
                        prompt_rows=True)
    _same_tree(cut, at_load.params, f"{case.id}: untie then truncate")


def test_unblock_params(case):
    """``unblock_params`` gives the plain load's tree, for the full and the truncated head."""
    plain = case.load(form="plain")
    _same_tree(kinds.unblock_params(case.draft.params), plain.params, f"{case.id}: unblock")
    rows = case.rows()
    cut = kinds.unblock_params(truncate_head(case.draft.params, case.draft.config, rows, True))
    _same_tree(cut, truncate_head(plain.params, plain.config, rows, True),
               f"{case.id}: unblock a truncated head")


def test_export(case, tmp_path):
    """``save_hf`` writes what loads back (float32, plain) as the same parameters; a truncated
    head is refused."""
    from dsbd_jax.training.export import save_hf
    cfg, params = case.draft.config, case.draft.params
    back = load_model(save_hf(tmp_path / "m", cfg, params), dtype=jnp.float32, progress=False,
                      kernel_blocks=None)
    want = jax.tree.map(lambda x: x.astype(jnp.float32), kinds.unblock_params(params))
    _same_tree(back.params, want, f"{case.id}: export")
    with pytest.raises(ValueError, match="truncated head"):
        save_hf(tmp_path / "t", cfg, truncate_head(params, cfg, case.rows()))


def test_distill_one_step(case, tmp_path):
    """One LoRA distillation step on the loaded pair: finite loss and held-out acceptance, and
    the exported draft loads back."""
    from dsbd_jax.training.distill import DistillConfig, distill
    dc = DistillConfig(steps=1, warmup_steps=0, batch_size=2, max_new_tokens=NEW, store_k=4,
                       eval_every=1, checkpoint_every=1, lora_rank=2, top_k=None, top_p=1.0)
    t, d = case.target, case.draft
    res = distill((t.config, t.params), (d.config, d.params), list(PROMPTS), list(PROMPTS), dc,
                  tmp_path / "run", t.config.eos_token_id, progress=False)
    assert res["step"] == 1
    assert all(0.0 <= a <= 1.0 for _, a in res["heldout_acceptance"])
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert np.isfinite(log[-1]["loss"])
    back = load_model(tmp_path / "run" / "model", dtype=jnp.float32, progress=False,
                      kernel_blocks=None)
    assert jax.tree.structure(back.params) == jax.tree.structure(kinds.unblock_params(d.params))


# ---------------------------------------------------------------------------------------------
# decoders
# the drafted decoders take the draft as loaded, or truncated (tree: without prompt rows;
# dsbd: with prompt rows, its head extended by each call's prompts inside the program)
DECODERS = ("sample", "beam_sample", "speculative", "tree_truncated", "dsbd_truncated",
            "dsbd_single_beam")


def _run(case, name):
    tc, dc = case.target.config, case.draft.config
    # the settings of distill's rollouts (one compiled sampling program where the trees match)
    base = dict(target=tc, max_new_tokens=NEW, top_k=None, top_p=1.0,
                eos_token_id=tc.eos_token_id)
    ids, lens = pad_prompts(PROMPTS, pad_id=0, length=max(map(len, PROMPTS)))
    key = jax.random.key(3)
    if name == "sample":
        return sample(case.target.params, ids, key, SampleConfig(**base), lens)
    if name == "beam_sample":
        return beam_sample(case.target.params, ids, key, BeamSampleConfig(**base, num_beams=2),
                           lens)
    draft = case.draft.params
    if name.endswith("_truncated"):
        draft = truncate_head(draft, dc, case.rows(), prompt_rows=name.startswith("dsbd"))
    pair = {"target": case.target.params, "draft": draft}
    if name == "speculative":
        return speculative_sample(pair, ids, key, SpeculativeConfig(**base, draft=dc, gamma=1),
                                  lens)
    if name == "tree_truncated":
        return tree_speculative_sample(pair, ids, key, TreeConfig(**base, draft=dc, gamma=1),
                                       lens)
    return dsbd_generate(pair, ids, key, DSBDConfig(**base, draft=dc, gamma=1, draft_width=2,
                                                    single_beam=name == "dsbd_single_beam"), lens)


# CI runs each decoder in two of the four pairwise cells, two that hold both values of every
# factor between them (float32 plain untied with bfloat16 transposed untied-as-rows, or float32
# transposed tied with bfloat16 plain tied); the rest of the matrix is extended
DECODER_CELLS = {
    **dict.fromkeys(("sample", "tree_truncated", "dsbd_truncated"),
                    {("float32", "plain", "untied"), ("bfloat16", "transposed", "untied")}),
    **dict.fromkeys(("beam_sample", "speculative", "dsbd_single_beam"),
                    {("float32", "transposed", "tied"), ("bfloat16", "plain", "tied")})}


@pytest.mark.parametrize("case, name", [
    pytest.param(c, n, id="-".join(c + (n,)),
                 marks=() if c in DECODER_CELLS[n] else pytest.mark.extended)
    for c in CASES for n in DECODERS], indirect=["case"])
def test_decoder(case, name):
    out = _run(case, name)
    V = case.target.config.vocab_size
    seqs, lens = np.asarray(out.sequences), np.asarray(out.lengths)
    ll, best = np.asarray(out.log_likelihoods), np.asarray(out.best)
    assert seqs.shape[0] == len(PROMPTS) and seqs.shape[2] == NEW
    assert seqs.min() >= 0 and seqs.max() < V
    assert not np.any(np.isnan(ll)) and np.all(ll <= 0)
    live = np.isfinite(ll)
    assert live.any(axis=1).all() and live[np.arange(len(PROMPTS)), best].all()
    if name in ("sample", "beam_sample", "speculative", "tree_truncated"):
        assert live.all()
    # every live beam's log-likelihood is the target's own log-probability of its tokens
    lp = _target_logprobs(case)
    for b, prompt in enumerate(PROMPTS):
        for w in np.flatnonzero(live[b]):
            n = int(lens[b, w])
            assert 1 <= n <= NEW
            assert np.isclose(lp(prompt, seqs[b, w, :n]), ll[b, w], rtol=1e-3, atol=1e-3), \
                (case.id, name, b, w)


def _target_logprobs(case):
    """``lp(prompt, tokens)``: the target's log-probability of ``tokens`` after ``prompt``, from
    one causal pass over the row (padded to one length: one compiled program per case)."""
    cfg, params = case.target.config, case.target.params
    width = max(map(len, PROMPTS)) + NEW

    def lp(prompt, tokens):
        row = list(prompt) + [int(t) for t in tokens]
        padded = np.zeros((1, width), np.int32)
        padded[0, :len(row)] = row
        logp = np.asarray(jax.nn.log_softmax(logits(cfg, params, padded)[0], axis=-1))
        at = np.arange(len(prompt) - 1, len(row) - 1)   # position i predicts token i + 1
        return float(np.sum(logp[at, np.asarray(row)[at + 1]]))
    return lp
