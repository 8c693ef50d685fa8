import os

import pytest
import torch

# Tests are small: at most two threads, and one per worker when pytest-xdist runs several (`-n auto`), so that
# the workers together do not oversubscribe the 2-core CI machine.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
