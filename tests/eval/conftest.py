"""The harness tests' shared fixtures: the tiny pair and a GSM8K file of the module's
``GSM_LOCAL`` problems."""

import pytest

from bench_setup import write_gsm


@pytest.fixture(scope="module")
def pair(bench_pair):
    return bench_pair


@pytest.fixture(scope="module")
def gsm_file(request, tmp_path_factory):
    return write_gsm(tmp_path_factory.mktemp("data") / "gsm.jsonl", request.module.GSM_LOCAL)
