"""`tupe pretrain --max-position-embeddings` larger than `--max-length`: the table has the extra rows, the run
records its training length, and `tupe evaluate --lengths` flags the rows that were never trained."""

from __future__ import annotations

import json

import pytest

from tupe.errors import TupeError


def test_table_larger_than_the_blocks_trains_and_evaluate_flags_untrained_rows(
    tmp_path, tiny_run, tiny_corpus
):
    from tupe.data.corpus import resolve_corpus
    from tupe.evaluation.evaluate import Settings, load_eval_model
    from tupe.evaluation.lengths import evaluate_lengths
    from tupe.training.pretrain import pretrain

    out = tmp_path / "run"
    pretrain(tiny_run(out, max_position_embeddings=48, max_steps=2, eval_steps=2, save_steps=2))
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 48
    assert json.loads((out / "tupe_run.json").read_text())["data"]["max_length"] == 32
    m = load_eval_model(out)
    assert (m.max_length, m.train_length) == (48, 32)
    assert load_eval_model(out / "checkpoint-2").train_length == 32  # read from the run folder above it
    settings = Settings(bootstrap=0, pppl_tokens=0, progress=False, max_blocks=4)
    from tupe.evaluation.evaluate import evaluate

    plain = evaluate([m], resolve_corpus([str(tiny_corpus)]), settings, log=lambda s: None)
    assert plain["tokenizer_groups"][0]["block_length"] == 32  # the trained rows, not the table's 48
    r = evaluate_lengths([m], resolve_corpus([str(tiny_corpus)]), [32, 48, 64], settings, log=lambda s: None)
    notes = [(e["length"], e["evaluated"], e["note"]) for e in r["by_length"]]
    assert notes == [
        (32, True, None),
        (48, True, "table rows 32-47 never trained (training length 32)"),
        (64, False, "no positions beyond 48 (--extend-positions extends the table)"),
    ]


def test_table_smaller_than_the_blocks_is_refused_before_any_work(tmp_path, tiny_run):
    from tupe.training.pretrain import pretrain

    with pytest.raises(TupeError, match="--max-position-embeddings 16 is smaller than --max-seq-len 32"):
        pretrain(tiny_run(tmp_path / "run", max_position_embeddings=16, prepare_only=True))
    assert not (tmp_path / "run").exists()
