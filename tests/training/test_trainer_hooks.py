"""What `PretrainTrainer` (tupe/training/trainer.py) relies on in the installed `transformers` `Trainer`: the
private methods it overrides or calls, with the signatures and the call sites it was written against, and the
public methods it replaces whole. docs/architecture.md ("The Trainer's private methods") lists each with why.
When a `transformers` upgrade changes one of them, this fails and names it, instead of tupe going wrong quietly."""

from __future__ import annotations

import inspect

import pytest
from transformers import Trainer

from tupe.training.trainer import PretrainTrainer

# name -> (its parameters after self, where the Trainer calls it: a method whose source holds the call; None for
# the one PretrainTrainer calls itself)
PRIVATE = {
    # the epoch-shuffled block order; get_train_dataloader builds the DataLoader over it
    "_get_train_sampler": (["train_dataset"], "get_train_dataloader", "self._get_train_sampler"),
    # where _save_checkpoint writes checkpoint-N: PretrainTrainer points it at a staging folder
    "_get_output_dir": (["trial"], "_save_checkpoint", "self._get_output_dir(trial=trial)"),
    # the atomic checkpoint (staging folder, manifest, rename); called by _maybe_log_save_evaluate
    "_save_checkpoint": (
        ["model", "trial"],
        "_maybe_log_save_evaluate",
        "self._save_checkpoint(model, trial)",
    ),
    # called (not overridden) by PretrainTrainer.train for a run resumed at max_steps
    "_load_from_checkpoint": (["resume_from_checkpoint", "model"], None, None),
}

# public methods PretrainTrainer overrides without calling the Trainer's (or around it), and their parameters
PUBLIC = {
    "get_batch_samples": ["epoch_iterator", "num_batches", "device"],
    "save_model": ["output_dir", "_internal_call"],
    "log": ["logs", "start_time"],
    "train": ["resume_from_checkpoint", "trial", "ignore_keys_for_eval"],
    "compute_loss": ["model", "inputs", "return_outputs", "num_items_in_batch"],
    "evaluate": ["eval_dataset", "ignore_keys", "metric_key_prefix"],
    "create_optimizer": ["model"],
}


def _parameters(name: str) -> list[str]:
    return [p for p in inspect.signature(getattr(Trainer, name)).parameters if p != "self"]


def _trainer_source() -> str:
    import transformers.trainer

    return inspect.getsource(transformers.trainer)


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_the_private_trainer_methods_tupe_relies_on_are_unchanged(name: str) -> None:
    parameters, caller, call = PRIVATE[name]
    assert hasattr(Trainer, name), f"transformers' Trainer has no {name} any more: revisit PretrainTrainer"
    assert _parameters(name) == parameters, (
        f"Trainer.{name}{inspect.signature(getattr(Trainer, name))} is not the ({', '.join(parameters)}) "
        "PretrainTrainer was written against: revisit tupe/training/trainer.py"
    )
    if caller is not None:
        assert call in inspect.getsource(getattr(Trainer, caller)), (
            f"Trainer.{caller} no longer calls {call}: PretrainTrainer's override would never run"
        )


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_the_public_trainer_methods_tupe_overrides_keep_their_parameters(name: str) -> None:
    assert _parameters(name)[: len(PUBLIC[name])] == PUBLIC[name], (
        f"Trainer.{name}{inspect.signature(getattr(Trainer, name))} changed: revisit PretrainTrainer.{name}"
    )


def test_the_trainer_sets_its_epoch_before_the_step_end_callbacks_and_logs_it() -> None:
    """`PassesCallback.on_step_end` replaces the Trainer's `state.epoch`: the Trainer must set its own before the
    step-end callbacks (else it would overwrite ours), and `log` must take `epoch` from the state."""
    source = _trainer_source()
    ours, step_end = (
        source.find("self.state.epoch = epoch +"),
        source.find("self.callback_handler.on_step_end("),
    )
    assert 0 <= ours < step_end and source[ours:step_end].count("\n") < 5, "the Trainer's epoch update moved"
    assert 'logs["epoch"] = self.state.epoch' in inspect.getsource(Trainer.log)


def test_pretrain_trainer_overrides_no_other_private_method() -> None:
    """A new private override must be listed above (and in docs/architecture.md) with why."""
    private = {
        name
        for name, value in vars(PretrainTrainer).items()
        if name.startswith("_") and not name.startswith("__") and callable(value) and hasattr(Trainer, name)
    }
    assert private == set(PRIVATE) - {"_load_from_checkpoint"}
