"""Fixtures of the training tests."""

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A directory holding the tiny random pair (``target/``, ``draft/``), one per module."""
    from dsbd_jax.testing import make_tiny_pair
    d = tmp_path_factory.mktemp("pair")
    make_tiny_pair(d)
    return d
