import pytest

from .fixtures import ALL_TASKS, make_checkpoint, write_task


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory):
    """A GLUE root with every task in its own layout."""
    root = tmp_path_factory.mktemp("glue")
    for task in ALL_TASKS:
        write_task(root, task)
    return root


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny pre-trained-looking tupe-a checkpoint with its tokenizer."""
    return make_checkpoint(tmp_path_factory.mktemp("model") / "tiny-tupe-a")
