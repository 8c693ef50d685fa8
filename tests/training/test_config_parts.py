"""Pre-training's configuration as parts (tupe/training/config.py): each setting in one part, each part checked
once where it is made, and run folders written before the parts existed still resume (their `tupe_run.json`)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tupe.data.config import DataConfig
from tupe.errors import TupeError
from tupe.training.config import ModelConfig, OptimConfig, PretrainConfig, ResolvedConfig, RunConfig

RECORDS = Path(__file__).resolve().parents[1] / "data" / "run_records_e1cb602"
PARTS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "run": RunConfig}


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_setting_is_in_exactly_one_part() -> None:
    given = _names(PretrainConfig) - {"extra"}
    owners: dict[str, list[str]] = {}
    for part, cls in PARTS.items():
        for name in _names(cls):
            owners.setdefault(name, []).append(part)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    assert set(owners) - given == {"world_size"}  # the one setting the command line does not give
    assert given - set(owners) == set()
    run = PretrainConfig(
        out="o", scheme="rope", packing="documents", lr_scheduler="cosine", threads=2
    ).resolve(1)
    assert isinstance(run, ResolvedConfig)
    assert (run.model.scheme, run.data.packing, run.optim.lr_scheduler, run.run.threads) == (
        "rope",
        "documents",
        "cosine",
        2,
    )
    assert run.data.max_length == run.model.max_position_embeddings == 128  # mini's block length


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (dict(scheme="no-such"), "unknown scheme 'no-such'"),  # ModelConfig
        (dict(packing="rows"), "unknown --packing 'rows'; choose one of: stream, documents"),  # DataConfig
        (dict(max_length=0), "--max-seq-len must be positive, got 0"),
        (dict(lr_scheduler="nope"), "unknown --lr-scheduler 'nope'"),  # OptimConfig
        (dict(optimizer="nope"), "unknown optimizer 'nope'"),
        (dict(save_steps=0), "--save-steps must be positive, got 0"),  # RunConfig
        (dict(report_to="nope"), "--report-to"),
        # what ties two parts together (ResolvedConfig)
        (
            dict(scheme="hf-bert", packing="documents"),
            "--packing documents keeps attention inside each document",
        ),
        (dict(max_position_embeddings=64), "--max-position-embeddings 64 is smaller than --max-seq-len 128"),
        (
            dict(batch_size=6, grad_accum=4),
            r"--batch-size 6 \(global\) is not divisible by processes x --grad-accum",
        ),
    ],
)
def test_each_part_refuses_its_own_bad_value_in_one_line(over: dict[str, Any], message: str) -> None:
    with pytest.raises(TupeError, match=message) as err:
        PretrainConfig(out="o", **over).resolve(1)
    assert "\n" not in str(err.value)


def test_packing_is_checked_once_from_the_command_line_to_the_data(
    tiny_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """One check of `--packing` where the data part is made; building the data checks nothing again, and the
    prepared data carries the choice (no `isinstance` to find it again)."""
    import tupe.data.config as data_config

    calls: list[str] = []
    original = data_config.check_packing
    monkeypatch.setattr(data_config, "check_packing", lambda v: calls.append(v) or original(v))
    run = tiny_run(tmp_path / "r", packing="documents").resolve(1)
    assert calls == ["documents"]
    data = run.data.build(log=lambda m: None, progress=False)
    assert calls == ["documents"] and data.packing == "documents"
    assert data.describe()["packing"] == "documents" and data.stream_path == data.packed.packed.path


def _as_run(record: str, tiny_run, out: Path) -> PretrainConfig:  # noqa: ANN001
    """The settings the e1cb602 run of `record` was made with (tests/data/run_records_e1cb602, written by
    `tupe pretrain` at e1cb602 from the tiny corpus and tokenizer of tests/training/conftest.py)."""
    over = {}
    if record == "documents":
        over = dict(packing="documents", lr_scheduler="cosine", optimizer="adafactor", positional_lr_scale=0.5,
                    positional_weight_decay=0.0, scheme="tupe-r")  # fmt: skip
    return tiny_run(out, **over)


@pytest.mark.parametrize("record", ["stream", "documents"])
def test_a_run_folder_of_e1cb602_is_the_same_run_for_this_code(
    record: str, tiny_run, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:  # noqa: ANN001
    """A `tupe_run.json` written by e1cb602, read by `check_out_dir` against the identity this code records for
    the same settings: the same run (`--resume` continues it), and another setting is still refused by name."""
    from tupe.data.tokenizer import load_tokenizer
    from tupe.training.run_folder import RUN_FILE, check_out_dir, run_identity

    out = tmp_path / record
    out.mkdir()
    shutil.copy(RECORDS / f"{record}.json", out / RUN_FILE)
    old = json.loads((out / RUN_FILE).read_text())
    run = _as_run(record, tiny_run, out).resolve(1)
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    fingerprints = old["data"]["corpus"], old["data"]["tokenizer"]
    identity = run_identity(run, run.model.values(tokenizer), *fingerprints)
    assert {k: v for k, v in old.items() if k not in ("preset", "corpus_desc")} == identity
    assert check_out_dir(out, identity, resume=True, overwrite=False) == "resume"
    other = run_identity(dataclasses.replace(run, data=dataclasses.replace(run.data, packing="stream")), identity["model"], *fingerprints)  # fmt: skip
    if record == "documents":
        with pytest.raises(TupeError, match="--packing: 'documents' -> 'stream'"):
            check_out_dir(out, other, resume=True, overwrite=False)
