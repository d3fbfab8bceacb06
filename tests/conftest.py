"""Shared pytest setup: keep thread use modest (the test machines have few cores)."""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def torch():
    """``torch`` limited to 2 threads and seeded (skips the test where torch is missing)."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    return torch
