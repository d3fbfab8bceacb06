"""Shared pytest setup: keep thread use modest (the test machines have few cores), and keep one
process below the kernel's memory-map limit."""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# no persistent compilation cache: a test's compile counts and timings must not depend on what
# an earlier run left on disk (tests/host/test_compilation_cache.py turns it on in a subprocess)
os.environ.setdefault("DSBD_JAX_COMPILATION_CACHE", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """After a test module, free jax's cached programs once the process holds half of the
    kernel's memory maps (``vm.max_map_count``): every compiled XLA program keeps some, and a
    run of several test folders in one process (``scripts/test.sh tests/decoding tests/eval``)
    otherwise reaches the limit and dies with a segmentation fault inside a compilation
    (``dsbd_jax/decoding/_jit/compiles.py``). Below half nothing is freed, so a module's programs
    still serve the next module."""
    yield
    from dsbd_jax.decoding._jit.compiles import map_usage
    usage = map_usage()
    if usage is not None and usage[0] > usage[1] // 2:
        import gc

        import jax
        jax.clear_caches()
        gc.collect()


@pytest.fixture(autouse=True)
def _memory_slot(request):
    """Every test holds a slot of the suite's memory lock while it runs (``memory_lock.py``): the
    real-model tests (marked ``slow``, GBs each) exclusively, so that no test of the other lane
    of ``scripts/test.sh`` runs beside them; the others shared."""
    from pathlib import Path

    from memory_lock import memory_slot
    heavy = request.node.get_closest_marker("slow") is not None
    if os.environ.get("DSBD_TEST_MEMORY_LOCK") == "0" and not heavy:
        # a lane of light tests only (scripts/newest_jax.sh's tiny models) beside the real-model
        # tests: its memory is small, so it does not wait for them
        yield
        return
    with memory_slot(Path(__file__).resolve().parents[1], heavy):
        yield


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
