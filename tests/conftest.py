"""Shared pytest setup: keep thread use modest (the test machines have few cores)."""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def torch():
    """``torch`` limited to 1 thread (tiny models: a thread pool only adds overhead) and seeded
    (skips the test where torch is missing)."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch


@pytest.fixture(scope="module")
def toy():
    """The sampling/beam tests' toy model (vocab 6, scaled weights) with its exact next-token
    log-prob function: ``(config, params, lp_fn)``."""
    from exact_reference import make_lp_fn, toy_model

    config, params = toy_model(vocab=6, seed=0, scale=2.0)
    return config, params, make_lp_fn(config, params)


@pytest.fixture(scope="module")
def bench_pair(tmp_path_factory, torch):
    """A tiny random target/draft pair in Hugging Face format, loaded: ``(target dir, draft dir,
    target, draft)`` (the harness tests' models)."""
    from dsbd_jax import load_model
    from dsbd_jax.testing import make_tiny_pair
    t, d = make_tiny_pair(tmp_path_factory.mktemp("tiny"), seed=0, noise=0.1)
    return t, d, load_model(t, progress=False), load_model(d, progress=False)
