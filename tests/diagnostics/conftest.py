import pytest

from ..helpers import torch_threads


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The diagnostics' models are tiny and their jobs run on one thread (`run_job`): so do the tests."""
    with torch_threads(1):
        yield
