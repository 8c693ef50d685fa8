"""Named sizes for pre-training: `mini` (a CPU demo), `base` (BERT-Base, modest budget), `paper` (Table 2 exactly).

Every value can be overridden from the command line (`--hidden-size`, `--max-steps`, ...).
"""

from __future__ import annotations

from typing import Any

from tupe.errors import TupeError

# The CPU recipe: 1,800 steps of 32 x 128 tokens, about 10 minutes on one core of a quiet 2-core machine
# (`tupe demo` runs it for 1,400 steps, two schemes side by side). Warm-up 100 and peak lr 1e-3 (3e-3 kept BERT-A at the unigram loss; see
# docs/RESULTS.md for the exploration); dropout 0 because a few thousand steps underfit; 1 block in 50 held out
# (425 validation blocks of the built-in corpus, ~8,000 masked tokens per evaluation).
_MINI: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=512,
    max_length=128,
    vocab_size=8192,
    dropout=0.0,
    batch_size=32,
    max_steps=1800,
    learning_rate=1e-3,
    warmup_steps=100,
    eval_steps=100,
    save_steps=500,
    logging_steps=50,
    valid_every=50,
)

# BERT-Base shape with a budget one GPU can do in about a day; `paper` extends it.
_BASE: dict[str, Any] = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_length=512,
    vocab_size=32768,
    dropout=0.1,
    batch_size=64,
    max_steps=100_000,
    learning_rate=2e-4,
    warmup_steps=5_000,
    eval_steps=2_000,
    save_steps=10_000,
    logging_steps=100,
)

# Model shape + data + optimisation; batch_size is the global batch per optimizer step (all processes, all
# accumulation steps), as in the paper.
PRESETS: dict[str, dict[str, Any]] = {
    "mini": _MINI,
    # The reproduction recipe (docs/RESULTS.md): the mini recipe at width 256 (4 heads of 64, FFN 1024),
    # 4,000 steps.
    # At width 128 BERT-A stays on the bag-of-words plateau for thousands of steps; this is the smallest shape
    # tried at which it starts to leave it. About 1 s per step on one core of a quiet 2-core machine.
    "small": dict(
        _MINI,
        hidden_size=256,
        intermediate_size=1024,
        max_steps=4000,
        save_steps=250,
    ),
    "base": _BASE,
    # The paper's Table 2 recipe (docs/pretraining.md): BERT-Base's shape, a 4x larger batch, 1M steps,
    # checkpoints at 100k, 300k, 600k and 1M.
    "paper": dict(
        _BASE,
        batch_size=256,
        max_steps=1_000_000,
        learning_rate=1e-4,
        warmup_steps=10_000,
        eval_steps=10_000,
        save_steps=50_000,
        save_at=[100_000, 300_000, 600_000, 1_000_000],
        logging_steps=500,
    ),
}

COMMON: dict[str, Any] = dict(
    optimizer="adamw",  # the paper's; tupe.training.optimizers.OPTIMIZERS has the others
    lr_scheduler="linear",  # warm-up, then linear decay to 0 (the paper's)
    weight_decay=0.01,
    adam_beta1=0.9,
    adam_beta2=0.999,
    adam_epsilon=1e-6,
    max_grad_norm=1.0,
    mlm_probability=0.15,
    valid_every=200,  # 199:1 train/valid
)


def get_preset(name: str) -> dict[str, Any]:
    """The preset's settings merged with the recipe values every preset shares."""
    if name not in PRESETS:
        raise TupeError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return {**COMMON, "save_at": [], **PRESETS[name]}
