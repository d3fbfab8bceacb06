"""16-bit models: the mixed-precision products, the head stored as rows, and the per-host dtype
choice (dsbd_jax/models/products.py, kernels.py, host.py)."""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.host import forms
from dsbd_jax.decoding._jit import inputs
from dsbd_jax.models import products
from dsbd_jax.host import cpu_options
from dsbd_jax.host import plan as host
from dsbd_jax.models import kinds
from dsbd_jax.models import llama as M
from dsbd_jax.models.weights import Rows
from dsbd_jax.models.vocab import truncate_head, with_prompt_rows


def _bf16(a):
    return jnp.asarray(a, jnp.float32).astype(jnp.bfloat16)


@pytest.mark.parametrize("m", [1, 2, 5])
def test_mixed_products_accumulate_in_float32(m):
    """Both forms of a bfloat16 kernel give the float64 product of the bfloat16-rounded operands
    to float32 rounding (a bfloat16 accumulation would be ~1e-2 off), as float32."""
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 96)).astype(np.float32)
    w = (rng.standard_normal((96, 40)) / 10).astype(np.float32)
    wb = _bf16(w)
    want = np.asarray(_bf16(x), np.float64) @ np.asarray(wb, np.float64)
    cols = products.mixed_cols(jnp.asarray(x), wb)
    rows = products.mixed_rows(jnp.asarray(x), wb.T)
    for got in (cols, rows, products.project(jnp.asarray(x), wb),
                products.project_t(jnp.asarray(x), wb.T.reshape(2, 20, 96))):
        assert got.dtype == jnp.float32 and got.shape == (m, 40)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    assert products.is_mixed(wb) and not products.is_mixed(jnp.asarray(w))


def test_one_row_is_padded_to_two_and_gives_the_same_row():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)
    w = _bf16(rng.standard_normal((32, 64)) / 8)
    two = np.asarray(products.mixed_rows(x, w))
    one = np.asarray(products.mixed_rows(x[:1], w))
    np.testing.assert_array_equal(one, two[:1])
    hlo = jax.jit(products.mixed_rows).lower(x[:1], w).as_text()
    assert "tensor<2x64xbf16>" in hlo  # the product runs on two rows


def test_float32_products_are_unchanged():
    """A float32 kernel takes the float32 product exactly as before (no cast, no padding)."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((3, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(products.project(x, w)),
                                  np.asarray(jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())))))


def _toy16():
    config, params = ref.toy_model(vocab=12, seed=3, layers=2, dtype="bfloat16")
    return config, M.convert_layout(params, "per_layer")


def test_rows_form_of_a_bfloat16_model_gives_the_same_logits():
    """Projections transposed and the head as ``[V, d]`` rows: the plain bfloat16 model's
    logits and keys to float rounding, for one token, a batch, a forest; the activations and
    logits are float32, the returned keys bfloat16 (the cache's dtype)."""
    config, params = _toy16()
    widths = {p: n for p, (_, n) in kinds.projection_shapes(config).items()}
    rows = kinds.transpose_head(kinds.transpose_params(params, widths))
    assert isinstance(rows["lm_head"]["kernel"], Rows) and kinds.head_transposed(rows)
    assert rows["lm_head"]["kernel"].value.shape == (12, 16)
    ref.assert_same_forward(config, params, [rows], [(1, 1), (3, 1), (1, 5)])
    from dsbd_jax.models.cache import empty_cache
    out, kv = M.forward(config, rows, jnp.zeros((1, 2), jnp.int32),
                        jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2, 2), bool),
                        empty_cache(config, 1, 0))
    assert out.dtype == jnp.float32 and kv.k.dtype == jnp.bfloat16
    # back to [in, out] exactly; the parameter check accepts both forms
    back = kinds.unblock_params(rows)
    assert not kinds.head_transposed(back)
    np.testing.assert_array_equal(np.asarray(back["lm_head"]["kernel"]),
                                  np.asarray(params["lm_head"]["kernel"]))
    inputs.check_params("target", config, rows)
    inputs.check_params("target", config, back)
    with pytest.raises(ValueError, match="lm_head"):
        bad = dict(rows, lm_head={"kernel": Rows(rows["lm_head"]["kernel"].value[:-1])})
        inputs.check_params("target", config, bad)


def test_truncated_head_as_rows_with_prompt_rows():
    """A truncated 16-bit head stored as ``[N, d]`` rows gives the logits of the ``[d, N]``
    head, also after its prompt rows are added."""
    config, params = _toy16()
    head = truncate_head(params, config, [0, 2, 5, 7], prompt_rows=True)
    rows = kinds.transpose_head(head)
    assert rows["vocab_head"]["kernel"].value.shape == (4, 16)
    inputs.check_params("draft", config, rows)
    prompt = jnp.asarray([[3, 9, 2]], jnp.int32)
    a, b = with_prompt_rows(head, prompt), with_prompt_rows(rows, prompt)
    assert b["vocab_head"]["kernel"].value.shape == (7, 16)
    ids = np.asarray([[1, 4, 6]], np.int32)
    np.testing.assert_allclose(np.asarray(M.logits(config, b, ids)),
                               np.asarray(M.logits(config, a, ids)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(kinds.unblock_params(rows)["vocab_head"]["kernel"]),
                                  np.asarray(head["vocab_head"]["kernel"]))


# ---------------------------------------------------------------------------------------------
# the per-host dtype choice
def test_pick_dtype_keeps_the_flags_choice_unless_decisively_slower():
    f32 = {1: 1.0, 12: 1.0}
    # bfloat16 must be DECISIVE faster over both passes to displace a float32 prior ...
    assert host.pick_dtype({"float32": f32, "bfloat16": {1: 0.7, 12: 0.7}}, "float32") == "bfloat16"
    assert host.pick_dtype({"float32": f32, "bfloat16": {1: 0.85, 12: 0.85}}, "float32") == "float32"
    # ... and float32 DECISIVE faster to displace a bfloat16 prior (an AMX host whose one-token
    # pass is slower in bfloat16 but whose forest is much faster keeps bfloat16)
    assert host.pick_dtype({"float32": {1: 193, 12: 453}, "bfloat16": {1: 265, 12: 237}},
                           "bfloat16") == "bfloat16"
    assert host.pick_dtype({"float32": f32, "bfloat16": {1: 1.5, 12: 1.5}}, "bfloat16") == "float32"
    assert host.prior_dtype(("avx512f", "amx_tile", "amx_bf16"))[0] == "bfloat16"
    assert host.prior_dtype(("avx512f", "avx512_bf16"))[0] == "bfloat16"
    assert host.prior_dtype(("avx512f", "avx512_vnni"))[0] == "float32"
    assert host.prior_dtype(())[0] == "float32"


def test_the_probe_cuts_layers_and_head_alike():
    from dsbd_jax.host import pass_probe
    config, _ = ref.toy_model(vocab=12)
    big = config.replace(num_layers=28, vocab_size=151936, max_position_embeddings=64)
    cut = pass_probe.cut_config(big, 4)
    assert cut.num_layers == 4 and cut.vocab_size == round(151936 * 4 / 28)
    assert cut.max_position_embeddings >= pass_probe.PROBE_SLOTS + max(pass_probe.PROBE_ROWS)
    assert pass_probe.cut_config(config.replace(num_layers=2), 4).num_layers == 2


def test_dtype_choice_is_forced_small_or_measured_once(monkeypatch, tmp_path):
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    config, _ = ref.toy_model(vocab=12)
    monkeypatch.setenv(host.ENV, "bfloat16")
    assert host.dtype_choice(config) == ("bfloat16", "$DSBD_JAX_DTYPE=bfloat16")
    monkeypatch.setenv(host.ENV, "fp8")
    with pytest.raises(ValueError, match="DSBD_JAX_DTYPE"):
        host.choose_dtype(config)
    monkeypatch.delenv(host.ENV)
    assert host.choose_dtype(config) == "float32"  # a tiny model: not measured
    assert host.dtype_key(config) not in cpu_options.host_entries()
    # a model past MIN_ELEMENTS is measured once (its passes, both dtypes, repeated), then read
    # back
    monkeypatch.setattr(forms, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(host, "load_per_core", lambda since=None: 0.0)     # a quiet host
    _clear()
    calls = []
    real = host.measure_dtypes

    def counted(cfg, **kw):
        calls.append(cfg.hidden_size)
        return real(cfg, rows=host.PROBE_ROWS, layers=1, repeats=1)
    monkeypatch.setattr(host, "measure_dtypes", counted)
    mid = config.replace(hidden_size=128, intermediate_size=256)
    first, how = host.dtype_choice(mid)
    assert first in host.DTYPES and 2 <= len(calls) <= host.TRIES and set(calls) == {128}
    # stored in the one plan file, under this host, as the shape's dtype entry
    entry = json.loads(cpu_options.cache_file().read_text())[cpu_options.host_key()][
        host.dtype_key(mid)]
    assert cpu_options.cache_file().name == "host_plan.json"
    as_int = lambda f: {d: {int(t): v for t, v in e.items()} for d, e in f.items()}  # noqa: E731
    assert first == host.pick_for(as_int(entry["min_ms"]), host.prior_dtype()[0],
                                  host.passes_of(), as_int(entry["worst_ms"]))
    assert "float32" in how and "bfloat16" in how and "measured" in how
    assert set(entry["min_ms"]) == {"float32", "bfloat16"} and "spread" in entry
    n = len(calls)
    _clear()
    again, how = host.dtype_choice(mid)
    if entry["final"]:
        assert again == first and len(calls) == n and "cached" in how  # read back
    else:     # the repeats disagreed on this busy test host: measured again, as it should be
        assert len(calls) > n and "measured" in how
    assert "bfloat16" in how
    plan = host.plan(mid, "bfloat16", form="transposed")
    assert plan.dtype == "bfloat16" and plan.head_transposed
    assert not host.plan(mid, "float32", form="transposed").head_transposed
    _clear()


def _clear():
    host._measured.cache_clear()
    host._choose_dtype.cache_clear()
    host._logged.cache_clear()


# the passes of an AVX2 host's 1.5B target as measured on one (issue 91): the forest runs
# faster in bfloat16, the one-token pass slower
AVX2_MS = {"float32": {1: 42.0, 4: 60.0, 12: 286.0}, "bfloat16": {1: 70.0, 4: 75.0, 12: 161.0}}


def _s(ms):
    """A fake probe's answer in seconds, as ``measure_dtypes`` gives it."""
    return {d: {r: v / 1e3 for r, v in e.items()} for d, e in ms.items()}


@pytest.fixture
def avx2_host(monkeypatch, tmp_path):
    """The flags' prior of an AVX2-only host (``$DSBD_JAX_CPU_FLAGS``), a model past
    ``MIN_ELEMENTS``, an empty plan cache and a quiet host."""
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    monkeypatch.setenv(cpu_options.FLAGS_ENV, "avx2,fma")
    monkeypatch.delenv(host.ENV, raising=False)
    cpu_options.cpu_flags.cache_clear()
    monkeypatch.setattr(forms, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(host, "load_per_core", lambda since=None: 0.1)
    _clear()
    config, _ = ref.toy_model(vocab=12)
    yield config.replace(hidden_size=128, intermediate_size=256)
    _clear()
    cpu_options.cpu_flags.cache_clear()


def test_avx2_host_samples_in_float32_and_says_why(avx2_host, monkeypatch):
    """With the flags of an AVX2-only host, ``auto`` keeps float32 for sampling and beam
    sampling (their one-token passes run slower in bfloat16) and for a plain load that does not
    know its decoder, while DSBD's target alone, whose forest runs decisively faster in
    bfloat16 on every repeat, may take bfloat16; each answer says why."""
    assert cpu_options.cpu_flags() == ("avx2", "fma")
    assert host.prior_dtype() == ("float32", "the CPU has neither AMX-BF16 nor AVX512-BF16")
    calls = []
    monkeypatch.setattr(host, "measure_dtypes", lambda cfg: calls.append(1) or _s(AVX2_MS))
    for methods in ("sample", "beam", ("sample", "beam"), ("beam", "dsbd"), None):
        dt, why = host.dtype_choice(avx2_host, methods)
        assert dt == "float32", methods
        assert "neither AMX-BF16 nor AVX512-BF16" in why and "the flags' choice stands" in why
    dt, why = host.dtype_choice(avx2_host, "sample")
    assert "over 1 / 4 new tokens: float32 42.00 / 60.00 ms, bfloat16 70.00 / 75.00 ms" in why
    assert host.dtype_choice(avx2_host, "dsbd")[0] == "bfloat16"
    assert host.dtype_choice(avx2_host, None, "draft")[0] == "float32"
    assert len(calls) == 2          # measured once (two agreeing repeats), for every decoder
    assert host.plan(avx2_host, methods="beam").dtype == "float32"


def test_a_noisy_probe_is_measured_again_and_not_cached_as_final(avx2_host, monkeypatch):
    """A fake probe whose repeats disagree by far more than ``NOISE``: the plan measures it
    ``TRIES`` times, keeps the flags' prior (the other dtype does not win on every repeat),
    stores the figures as not final, and the next process measures again; once the probe
    agrees on a quiet host, the figures are final and read back."""
    noisy = iter([_s(AVX2_MS),
                  _s({"float32": {1: 90.0, 4: 120.0, 12: 600.0},
                      "bfloat16": {1: 30.0, 4: 35.0, 12: 80.0}})] * 10)
    calls = []
    monkeypatch.setattr(host, "measure_dtypes", lambda cfg: calls.append(1) or next(noisy))
    dt, why = host.dtype_choice(avx2_host, "beam")
    assert dt == "float32" and len(calls) == host.TRIES
    assert "not final: measured again next run" in why
    entry = cpu_options.host_entries()[host.dtype_key(avx2_host)]
    assert entry["final"] is False and entry["spread"] > host.NOISE and entry["tries"] == 3
    assert entry["load"] == 0.1
    _clear()                         # a new process: the entry is not final, so measured again
    steady = {"float32": {1: 40.0, 4: 60.0, 12: 280.0}, "bfloat16": {1: 70.0, 4: 75.0, 12: 160.0}}
    monkeypatch.setattr(host, "measure_dtypes", lambda cfg: calls.append(1) or _s(steady))
    dt, why = host.dtype_choice(avx2_host, "beam")
    assert dt == "float32" and len(calls) == host.TRIES + 2 and "measured again" in why
    assert cpu_options.host_entries()[host.dtype_key(avx2_host)]["final"] is True
    _clear()
    assert "cached in" in host.dtype_choice(avx2_host, "beam")[1] and len(calls) == 5


def test_a_busy_host_does_not_cache_its_choice_as_final(avx2_host, monkeypatch):
    monkeypatch.setattr(host, "load_per_core", lambda since=None: 1.5)
    monkeypatch.setattr(host, "measure_dtypes", lambda cfg: _s(AVX2_MS))
    dt, why = host.dtype_choice(avx2_host, "sample")
    assert dt == "float32" and "load 1.50 per core" in why and "not final" in why
    assert cpu_options.host_entries()[host.dtype_key(avx2_host)]["final"] is False


def test_the_probes_own_work_is_not_load():
    """Whether a choice is made beside other work is read from the CPU time others used during
    the probe, not from the load average, which counts the probe's own passes: on a 2-core
    host a 90 s probe alone drove it over ``BUSY``, so no choice there was ever final."""
    quiet = ((0.0, 0.0, 0.0, 2), (20.0, 20.0, 10.0, 2))      # both cores busy, all the probe
    assert host.others_per_core(*quiet) == 0.0
    beside = ((0.0, 0.0, 0.0, 2), (30.0, 20.0, 10.0, 2))     # another job on one core
    assert host.others_per_core(*beside) == 0.5
    assert host.others_per_core((5.0, 5.0, 1.0, 2), (5.0, 5.0, 1.0, 2)) == 0.0
    before = host.cpu_seconds()
    if before is None:                                      # no /proc/stat: the load average
        assert host.load_per_core() >= 0.0
        return
    t = time.process_time()
    while time.process_time() - t < 0.3:                    # this process's own work
        sum(range(1000))
    after = host.cpu_seconds()
    assert after[1] - before[1] >= 0.25 and after[0] - before[0] >= 0.2
    assert 0.0 <= host.load_per_core(before) <= 1.0 + 1e-6


def test_passes_per_decoder_and_role():
    assert host.passes_of("sample") == ((1, 4),) and host.passes_of("beam") == ((1, 4),)
    assert host.passes_of("dsbd") == ((1, 12),)
    assert host.passes_of(("beam", "dsbd")) == ((1, 4), (1, 12))
    assert host.passes_of(("dsbd", "beam"), "draft") == ((1,),)
    with pytest.raises(ValueError, match="unknown decoder"):
        host.passes_of("greedy")
    # bfloat16 must win for every decoder that runs: a faster forest alone does not move beam
    t = {d: {int(r): v for r, v in e.items()} for d, e in AVX2_MS.items()}
    assert host.pick_for(t, "float32", host.passes_of("dsbd")) == "bfloat16"
    assert host.pick_for(t, "float32", host.passes_of(("beam", "dsbd"))) == "float32"
    # ... and on every repeat: its slowest run against the prior's fastest
    worst = {"float32": t["float32"], "bfloat16": {1: 70.0, 4: 75.0, 12: 300.0}}
    assert host.pick_for(t, "float32", host.passes_of("dsbd"), worst) == "float32"


def test_int8_draft_is_judged_on_a_drafts_rows():
    """The probe times 1 / 4 / 16 rows; a draft runs one to four, so 16 rows do not decide
    (the issue's quiet AVX2 figures: int8 faster at 1 row, even at 4, much slower at 16)."""
    t = {"float": {1: 8.6, 4: 8.6, 16: 17.4}, "int8": {1: 5.9, 4: 8.5, 16: 27.1}}
    assert forms.pick_weights(t) == "float"
    assert forms.pick_weights(t, forms.DRAFT_ROWS) == "int8"
    busy = {"float": {1: 7.7, 4: 12.0, 16: 28.1}, "int8": {1: 9.2, 4: 13.2, 16: 43.6}}
    assert forms.pick_weights(busy, forms.DRAFT_ROWS) == "float"


def test_another_host_never_reads_the_choice(monkeypatch, tmp_path):
    """The plan cache is keyed by the host, its CPU flags included: a choice stored on one host
    does not answer for a host whose flags differ (its prior differs too); each host keeps its
    own entries in the one file."""
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    config, _ = ref.toy_model(vocab=12)
    mid = config.replace(hidden_size=128, intermediate_size=256)
    entry = host.dtype_key(mid)
    measured = []

    def choose(answer):
        return cpu_options.cached_choice(entry, lambda d: d in host.DTYPES,
                                         lambda: measured.append(answer) or {answer: {1: 0.1}},
                                         lambda t: next(iter(t)))
    monkeypatch.setattr(cpu_options, "cpu_flags", lambda: ("avx512f",))
    a = cpu_options.host_key()
    assert choose("float32").choice == "float32" and measured == ["float32"]
    monkeypatch.setattr(cpu_options, "cpu_flags", lambda: ("avx512f", "amx_tile", "amx_bf16"))
    assert cpu_options.host_key() != a and entry not in cpu_options.host_entries()
    got = choose("bfloat16")        # measured again here, not read from the other host's entry
    assert got.choice == "bfloat16" and got.measured and measured == ["float32", "bfloat16"]
    stored = json.loads(cpu_options.cache_file().read_text())
    assert set(stored) == {a, cpu_options.host_key()}
    assert stored[a][entry]["choice"] == "float32"
    monkeypatch.setattr(cpu_options, "cpu_flags", lambda: ("avx512f",))
    assert choose("bfloat16").choice == "float32" and len(measured) == 2   # read back


def test_load_model_auto_dtype(tmp_path):
    """``load_model``'s default ``dtype="auto"`` records its choice (a tiny model: float32);
    a given dtype is used as given."""
    from dsbd_jax.loading.load import load_model, read_config
    ref.hf_tiny_llama(tmp_path, seed=0)
    m = load_model(tmp_path, tokenizer=False, progress=False)
    assert m.info["dtype"] == "float32" and m.config.dtype == "float32"
    assert "small model" in m.info["dtype_why"]
    assert read_config(tmp_path, "auto").dtype == "float32"
    b = load_model(tmp_path, jnp.bfloat16, tokenizer=False, progress=False)
    assert b.info["dtype"] == "bfloat16" and b.info["dtype_why"] == "given"


def test_cli_host_prints_the_plan(tmp_path, capsys, monkeypatch):
    from dsbd_jax import cli
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    cpu_options.write_cache(cpu_options.cache_file(), "an old choice", "x", {})
    assert cli.main(["host", "--remeasure", "--model", str(tmp_path / "none")]) == 2
    assert "--remeasure: dropped 1 choices cached for this host" in capsys.readouterr().out
    assert cpu_options.host_entries() == {}
    ref.hf_tiny_llama(tmp_path, seed=0)
    assert cli.main(["host", "--model", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "host: " in out and "kernels plain" in out
    assert "dtype float32 for any decoder (a small model" in out
    assert "dtype for sampling and beam sampling: float32 (a small model" in out
    assert "as a draft: float weights (--draft-weights auto: int8 draft not used here: a small " \
        "model" in out
    assert "; projections separate" in out   # a load fuses off the CPU only
    assert "as a DSBD target: a small model: not measured" in out
    assert "as a DSBD target in int8 (--weights int8): a small model: not measured" in out
    # then every choice cached for this host, from the one plan file
    assert f"this host's plan: {len(cpu_options.host_entries())} choices in" in out
    assert str(cpu_options.cache_file()) in out
    for entry in cpu_options.host_entries():
        assert f"  {entry}: " in out
    assert cli.main(["host", "--model", str(tmp_path), "--dtype", "bfloat16"]) == 0
    assert "dtype bfloat16 for any decoder (given)" in capsys.readouterr().out
