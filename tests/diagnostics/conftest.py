import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The diagnostics' models are tiny and their jobs run on one thread (`run_job`): so do the tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
