"""Every bad input the reliability suite tries, as data: how to make it, the command, what the error must say.

Used by `test_bad_inputs.py` (which asserts exit code 2, one `error:` line with the needles, no traceback; for the
Python API's cases, `API_CASES`, the exception and its one line) and by `python -m tests.reliability.bad_inputs`
(which prints the Markdown tables of docs/reliability.md with the messages the CLI and the API really give).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Ctx:
    """What a case may use: a scratch folder and the shared tiny artefacts."""

    tmp: Path
    corpus: Path  # a folder of valid text
    tokenizer: Path  # a tokenizer folder following the tupe contract
    cache: Path
    finished_run: Path  # a completed tiny `tupe pretrain` run (do not modify: copy it)
    glue_model: Path  # a tiny tupe-a checkpoint with tokenizer (do not modify: copy it)
    glue_data: Path  # a GLUE root with SST-2, STS-B and MRPC (do not modify: copy it)
    cleanup: list = field(default_factory=list)  # callables run after the case (stop helper processes)

    def pretrain(self, **over: object) -> list[str]:
        from .conftest import pretrain_args

        opts: dict[str, object] = {"corpus": self.corpus, "tokenizer": self.tokenizer, "max_steps": 2, **over}
        corpus, tokenizer = opts.pop("corpus"), opts.pop("tokenizer")
        out = opts.pop("out", self.tmp / "out")
        return pretrain_args(corpus, tokenizer, self.cache, out, **opts)  # type: ignore[arg-type]

    def glue(self, *extra: object, model: Path | None = None, task: str = "SST-2") -> list[str]:
        args = ["glue", "--model", model or self.glue_model, "--task", task, "--out", self.tmp / "g"]
        if "--train-file" not in extra and "--data-dir" not in extra:
            args += ["--data-dir", self.glue_data]
        return [*args, "--lrs", "1e-4", "--seeds", "1", "--epochs", "1", *extra]

    def evaluate_model(self, model: Path) -> list[str]:
        return ["evaluate", "--model", model, "--text", self.corpus]

    def evaluate(self, *extra: object) -> list[str]:
        return ["evaluate", "--model", self.glue_model, "--text", self.corpus, *extra]

    def copy_model(self) -> Path:
        return Path(shutil.copytree(self.glue_model, self.tmp / "model"))

    def copy_task(self, task: str) -> Path:
        return Path(shutil.copytree(self.glue_data / task, self.tmp / "data" / task))


@dataclass
class Case:
    id: str
    what: str  # the bad input, in words (a row of the docs table)
    make: Callable[[Ctx], list]  # builds the files, returns the CLI arguments
    needles: tuple[str, ...]  # what the one error line must contain


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _corpus_with(ctx: Ctx, name: str, data: bytes) -> Path:
    folder = Path(shutil.copytree(ctx.corpus, ctx.tmp / "corpus"))
    _write(folder / name, data)
    return folder


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _copy_run(ctx: Ctx) -> Path:
    return Path(shutil.copytree(ctx.finished_run, ctx.tmp / "run"))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _edit_config(ctx: Ctx, **changes: object) -> Path:
    m = ctx.copy_model()
    cfg = json.loads((m / "config.json").read_text())
    cfg.update(changes)
    (m / "config.json").write_text(json.dumps(cfg))
    return m


def _unfinished_run(ctx: Ctx) -> Path:
    run = _copy_run(ctx)
    for name in ("model.safetensors", "pretrain_summary.json"):
        (run / name).unlink()
    return run


def _bin_only(ctx: Ctx) -> list:
    import torch
    from safetensors.torch import load_file

    m = ctx.copy_model()
    torch.save(load_file(m / "model.safetensors"), m / "pytorch_model.bin")
    (m / "model.safetensors").unlink()
    return ctx.glue(model=m)


def _bad_tokenizer(ctx: Ctx) -> list:
    from tupe.data.tokenizer import load_tokenizer

    tok = load_tokenizer(ctx.tokenizer)
    vocab = tok.backend_tokenizer.to_str()
    data = json.loads(vocab)
    for entry in data["added_tokens"]:  # swap [CLS] and [SEP]: the model reads token 0 as [CLS]
        entry["content"] = {"[CLS]": "[SEP]", "[SEP]": "[CLS]"}.get(entry["content"], entry["content"])
    model_vocab = data["model"]["vocab"]
    model_vocab["[CLS]"], model_vocab["[SEP]"] = model_vocab["[SEP]"], model_vocab["[CLS]"]
    path = _write(ctx.tmp / "badtok" / "tokenizer.json", json.dumps(data))
    return ctx.pretrain(tokenizer=path)


def _glue_file(ctx: Ctx, task: str, name: str, text: str | bytes) -> list:
    d = ctx.copy_task(task)
    _write(d / name, text)
    return [
        "glue", "--model", ctx.glue_model, "--task", task, "--data-dir", d.parent, "--out", ctx.tmp / "g",
        "--lrs", "1e-4", "--seeds", "1", "--epochs", "1",
    ]  # fmt: skip


def _glue_missing_dev(ctx: Ctx) -> list:
    d = ctx.copy_task("SST-2")
    (d / "dev.tsv").unlink()
    return [
        "glue",
        "--model",
        ctx.glue_model,
        "--task",
        "SST-2",
        "--data-dir",
        d.parent,
        "--out",
        ctx.tmp / "g",
    ]


def _other_glue_run(ctx: Ctx) -> list:
    from tupe.cli import main

    base = ctx.glue("--max-train-samples", "8", "--max-eval-samples", "4", "--batch-size", "8")
    assert main([str(a) for a in base]) == 0
    return ctx.glue("--max-train-samples", "8", "--max-eval-samples", "4", "--batch-size", "4")


def _foreign_checkpoint(ctx: Ctx) -> list:
    from tupe.training.checkpointing import write_manifest

    run = _copy_run(ctx)
    ckpt = run / "checkpoint-4"
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["position_scheme"] = "bert-a"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    write_manifest(ckpt, 4)  # a complete checkpoint of another run, copied in
    return ctx.pretrain(out=run, resume=True)


def _corrupt_latest_and_previous(ctx: Ctx) -> list:
    run = _copy_run(ctx)
    for ckpt in sorted(run.glob("checkpoint-*")):
        _truncate(ckpt / "model.safetensors")
    return ctx.pretrain(out=run, resume=True)


def _folder_with_special(ctx: Ctx, name: str, kind: str) -> Path:
    folder = Path(shutil.copytree(ctx.corpus, ctx.tmp / "corpus"))
    if kind == "fifo":
        os.mkfifo(folder / name)
    else:
        os.symlink(kind, folder / name)
    return folder


def _bad_manifest(ctx: Ctx, files: object) -> list:
    from tupe.training.checkpointing import MANIFEST_NAME

    run = _copy_run(ctx)
    for ckpt in sorted(run.glob("checkpoint-*")):
        (ckpt / MANIFEST_NAME).write_text(json.dumps({"format": 1, "step": 4, "files": files}))
    return ctx.pretrain(out=run, resume=True)


def _pickled_optimizer(ctx: Ctx) -> list:
    import torch

    run = _copy_run(ctx)
    ckpts = sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    for ckpt in ckpts[:-1]:
        shutil.rmtree(ckpt)
    latest = ckpts[-1]
    torch.save({"state": {}, "param_groups": [], "evil": Path("x")}, latest / "optimizer.pt")
    from tupe.training.checkpointing import write_manifest

    write_manifest(latest, int(latest.name.split("-")[1]))  # a consistent manifest: only weights_only objects
    for name in ("model.safetensors", "pretrain_summary.json"):
        (run / name).unlink()
    return ctx.pretrain(out=run, resume=True, max_steps=8)


def _out_is_file(ctx: Ctx) -> list:
    return ctx.pretrain(out=_write(ctx.tmp / "f", "x"))


def _overwrite_after_a_second_writer(ctx: Ctx) -> list:
    """A lock held by another live process: the second writer is refused, naming it."""
    import subprocess
    import sys

    out = ctx.tmp / "locked"
    out.mkdir()
    code = (
        "import sys,time; from tupe.io.files import folder_lock\n"
        "with folder_lock(sys.argv[1], 'tupe pretrain'):\n print('locked', flush=True); time.sleep(60)\n"
    )
    from .conftest import subprocess_env

    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    ctx.cleanup.append(proc.kill)
    return ctx.pretrain(out=out)


CASES: list[Case] = [
    # ---------------------------------------------------------------------------------------- pretrain: corpus
    Case(
        "corpus-missing",
        "`--corpus` path that does not exist",
        lambda c: c.pretrain(corpus=c.tmp / "nope.txt"),
        ("corpus path not found", "nope.txt"),
    ),
    Case(
        "corpus-empty-file",
        "empty corpus file",
        lambda c: c.pretrain(corpus=_write(c.tmp / "empty.txt", "")),
        ("empty.txt", "is empty (no text)"),
    ),
    Case(
        "corpus-blank-file",
        "corpus file with only blank lines / spaces",
        lambda c: c.pretrain(corpus=_write(c.tmp / "blank.txt", "\n  \n\t\n")),
        ("blank.txt", "is empty"),
    ),
    Case(
        "corpus-jsonl-text-not-string",
        'JSONL corpus whose line 3 has `"text": 5` (was: dropped without a word; a file of only such rows "is empty")',
        lambda c: c.pretrain(
            corpus=_write(c.tmp / "c.jsonl", '{"text": "one two"}\n{"text": "three"}\n{"text": 5}\n')
        ),
        ("c.jsonl:3: 'text' is a number 5, not text", "--skip-bad-text"),
    ),
    Case(
        "corpus-jsonl-bad-line",
        "JSON-lines corpus whose line 51 is not JSON",
        lambda c: c.pretrain(
            corpus=_write(
                c.tmp / "c.jsonl",
                '{"text": "a line of text"}\n' * 50 + '{"text": cut\n' + '{"text": "more"}\n' * 10,
            )
        ),
        ("c.jsonl:51", "not JSON"),
    ),
    Case(
        "corpus-empty-folder",
        "corpus folder with no files",
        lambda c: c.pretrain(corpus=(c.tmp / "d").mkdir() or c.tmp / "d"),
        ("holds no text file",),
    ),
    Case(
        "corpus-glob-nothing",
        "glob pattern that matches nothing",
        lambda c: c.pretrain(corpus=str(c.tmp / "*.nothing")),
        ("matches no file",),
    ),
    Case(
        "corpus-latin1",
        "Latin-1 (not UTF-8) file among good ones",
        lambda c: c.pretrain(
            corpus=_corpus_with(c, "latin.txt", "ok line\ncaf\xe9 au lait\n".encode("latin-1"))
        ),
        ("latin.txt", "is not UTF-8", "invalid byte 0xe9 at byte offset 11", "--skip-bad-text"),
    ),
    Case(
        "corpus-binary",
        "binary file (PNG) in the corpus folder",
        lambda c: c.pretrain(corpus=_corpus_with(c, "image.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)))),
        ("image.png", "is a PNG image, not text", "--skip-bad-text"),
    ),
    Case(
        "corpus-utf16",
        'UTF-16 text file without byte-order mark (Windows "Unicode")',
        lambda c: c.pretrain(corpus=_write(c.tmp / "w.txt", "hello world\n".encode("utf-16-le"))),
        ("w.txt", "is not UTF-8 text", "invalid byte 0x00 at byte offset 1"),
    ),
    Case(
        "corpus-utf16-bom",
        "UTF-16 text file with byte-order mark",
        lambda c: c.pretrain(corpus=_write(c.tmp / "b.txt", "hello world\n".encode("utf-16"))),
        ("b.txt", "is not UTF-8 text", "invalid byte 0xff at byte offset 0"),
    ),
    Case(
        "corpus-gz-bad-utf8",
        "`.gz` file whose decompressed text is not UTF-8",
        lambda c: c.pretrain(corpus=_write(c.tmp / "x.txt.gz", _gz(b"good\nbad \xff\n"))),
        ("x.txt.gz", "byte offset 9 (decompressed)"),
    ),
    Case(
        "corpus-gz-corrupt",
        "`.gz` file that is not gzip",
        lambda c: c.pretrain(corpus=_write(c.tmp / "y.txt.gz", b"plain text, not gzip\n")),
        ("cannot read corpus file", "y.txt.gz", "Not a gzipped file"),
    ),
    Case(
        "corpus-gz-truncated",
        "`.gz` file cut short (interrupted download)",
        lambda c: c.pretrain(
            corpus=_write(c.tmp / "z.txt.gz", _gz(bytes(range(256)) * 64 + b"\n" * 10)[:300])
        ),
        ("cannot read corpus file", "z.txt.gz"),
    ),
    Case(
        "corpus-too-small",
        "corpus too small for two blocks",
        lambda c: c.pretrain(corpus=_write(c.tmp / "tiny.txt", "one two three\n")),
        ("corpus too small",),
    ),
    Case(
        "dataset-corrupt",
        "`datasets` folder that cannot be loaded",
        lambda c: c.pretrain(corpus=_write(c.tmp / "ds" / "state.json", "{}").parent),
        ("cannot load as a `datasets` dataset",),
    ),
    Case(
        "dataset-no-column",
        "`datasets` folder without the text column",
        lambda c: c.pretrain(corpus=_dataset(c)),
        ("has no column 'text'", "--text-column"),
    ),
    # ---------------------------------------------------------------------------------------- pretrain: options
    Case(
        "scheme-unknown",
        "unknown `--scheme`",
        lambda c: c.pretrain(scheme="tupe-x"),
        ("unknown scheme 'tupe-x'", "tupe-a"),
    ),
    Case(
        "preset-unknown",
        "unknown `--preset`",
        lambda c: c.pretrain(preset="huge"),
        ("--preset", "invalid choice: 'huge'"),
    ),
    Case(
        "option-not-a-number",
        "`--max-steps` that is not a number",
        lambda c: c.pretrain(max_steps="ten"),
        ("--max-steps", "got 'ten'"),
    ),
    Case(
        "steps-zero",
        "`--max-steps 0`",
        lambda c: c.pretrain(max_steps=0),
        ("--max-steps", "an integer from 1 to 2147483647, got 0"),
    ),
    Case(
        "heads-not-dividing",
        "`--num-heads` that does not divide `--hidden-size`",
        lambda c: c.pretrain(num_heads=3),
        ("hidden_size (32) must be a multiple of num_attention_heads (3)",),
    ),
    Case(
        "max-length-1",
        "`--max-length 1`",
        lambda c: c.pretrain(max_length=1),
        ("--max-length", "from 2 to 1048576"),
    ),
    Case(
        "vocab-too-small",
        "`--vocab-size` too small for a byte-level BPE",
        lambda c: c.pretrain(tokenizer=None, vocab_size=100),
        ("--vocab-size 100 is too small",),
    ),
    Case(
        "tokenizer-missing",
        "`--tokenizer` path that does not exist",
        lambda c: c.pretrain(tokenizer=c.tmp / "tok"),
        ("--tokenizer", "no such file or folder"),
    ),
    Case(
        "tokenizer-wrong-specials",
        "tokenizer whose special-token ids break the contract",
        _bad_tokenizer,
        ("tokenizer.json", "special token [CLS] has id 2", "need 1"),
    ),
    Case(
        "precision-bf16-cpu",
        "`--precision bf16` without a GPU",
        lambda c: c.pretrain(precision="bf16"),
        ("--precision bf16 needs a GPU",),
    ),
    Case(
        "batch-not-divisible",
        "global batch not divisible by `--grad-accum`",
        lambda c: c.pretrain(grad_accum=3),
        ("not divisible",),
    ),
    # ---------------------------------------------------------------------------------------- pretrain: --out
    Case(
        "out-is-file", "`--out` is a file", lambda c: c.pretrain(out=_write(c.tmp / "f", "x")), ("is a file",)
    ),
    Case(
        "out-foreign",
        "`--out` holds unrelated files (never wiped, even with --overwrite)",
        lambda c: c.pretrain(out=_write(c.tmp / "mine" / "notes.txt", "keep").parent, overwrite=True),
        ("not a tupe run folder", "notes.txt"),
    ),
    Case(
        "out-other-run",
        "`--out` holds a run with another scheme",
        lambda c: c.pretrain(out=_copy_run(c), scheme="bert-a", resume=True),
        ("holds a different run", "scheme: 'tupe-a' -> 'bert-a'", "--overwrite"),
    ),
    Case(
        "out-same-run",
        "`--out` holds this run and neither --resume nor --overwrite",
        lambda c: c.pretrain(out=_copy_run(c)),
        ("already holds this run", "--resume"),
    ),
    Case(
        "out-run-file-corrupt",
        "`--out` with a corrupt tupe_run.json",
        lambda c: c.pretrain(out=_write(_copy_run(c) / "tupe_run.json", '{"scheme": ').parent, resume=True),
        ("tupe_run.json:1: not valid JSON", "--overwrite"),
    ),
    Case(
        "resume-all-checkpoints-corrupt",
        "`--resume` where every checkpoint's weights are truncated",
        _corrupt_latest_and_previous,
        ("no complete checkpoint",),
    ),
    Case(
        "resume-foreign-checkpoint",
        "`--resume` where the latest checkpoint (valid manifest) is of another scheme",
        _foreign_checkpoint,
        ("checkpoint-4/config.json", "position_scheme 'bert-a' does not match this run's 'tupe-a'"),
    ),
    # ---------------------------------------------------------------------------------------------------- GLUE
    Case(
        "glue-task-unknown",
        "unknown GLUE `--task`",
        lambda c: c.glue(task="SST-9"),
        ("unknown GLUE task 'SST-9'",),
    ),
    Case(
        "glue-missing-column",
        "TSV without the label column",
        lambda c: _glue_file(c, "SST-2", "train.tsv", "sentence\tscore\nfine\t1\n"),
        ("train.tsv:1", "missing column 'label'"),
    ),
    Case(
        "glue-unknown-label",
        "TSV with an unknown label",
        lambda c: _glue_file(c, "SST-2", "dev.tsv", "sentence\tlabel\nfine\t1\nmeh\tpositive\n"),
        ("dev.tsv:3", "unknown label 'positive'"),
    ),
    Case(
        "glue-malformed-row",
        "TSV row with a missing field",
        lambda c: _glue_file(
            c,
            "MRPC",
            "train.tsv",
            "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n0\t3\t4\tonly one sentence\n",
        ),
        ("train.tsv:3", "malformed row", "4 tab-separated fields, expected 5"),
    ),
    Case(
        "glue-stsb-range",
        "STS-B score outside 0-5",
        lambda c: _glue_file(
            c,
            "STS-B",
            "dev.tsv",
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
            "sentence1\tsentence2\tscore\n0\tg\tf\ty\t0\ts\ts\ta\tb\t7.5\n",
        ),
        ("dev.tsv:2", "outside the STS-B range"),
    ),
    Case(
        "glue-not-utf8",
        "TSV that is not UTF-8",
        lambda c: _glue_file(c, "SST-2", "train.tsv", "sentence\tlabel\ncaf\xe9\t1\n".encode("latin-1")),
        ("train.tsv", "not UTF-8", "byte 18"),
    ),
    Case(
        "glue-empty-file",
        "empty TSV",
        lambda c: _glue_file(c, "SST-2", "dev.tsv", ""),
        ("dev.tsv:1", "empty file"),
    ),
    Case(
        "glue-jsonl-bad-line",
        "JSON-lines dev file with a broken line",
        lambda c: c.glue(
            "--train-file",
            c.glue_data / "SST-2" / "train.tsv",
            "--dev-file",
            _write(c.tmp / "dev.jsonl", '{"sentence": "ok", "label": 1}\n{"sentence": "cut\n'),
        ),
        ("dev.jsonl:2", "not JSON"),
    ),
    Case(
        "glue-model-missing",
        "`--model` folder that does not exist",
        lambda c: c.glue(model=c.tmp / "nomodel"),
        ("no config.json",),
    ),
    Case(
        "glue-scheme-mismatch",
        "`--scheme` other than the checkpoint's",
        lambda c: c.glue("--scheme", "bert-a"),
        ("--scheme bert-a does not match", "'tupe-a'"),
    ),
    Case(
        "glue-config-corrupt",
        "config.json that is not JSON",
        lambda c: c.glue(model=_write(c.copy_model() / "config.json", "{ not json").parent),
        ("config.json:1: not valid JSON", "model config"),
    ),
    Case(
        "glue-weights-truncated",
        "truncated model.safetensors (interrupted copy)",
        lambda c: c.glue(model=(lambda m: _truncate(m / "model.safetensors") or m)(c.copy_model())),
        ("model.safetensors: corrupt or truncated safetensors file",),
    ),
    Case(
        "glue-weights-garbage",
        "model.safetensors that is not safetensors",
        lambda c: c.glue(model=_write(c.copy_model() / "model.safetensors", b"<html>404</html>").parent),
        ("model.safetensors: corrupt or truncated",),
    ),
    Case(
        "glue-weights-config-mismatch",
        "config.json edited after training (weights of another shape)",
        lambda c: c.glue(model=_edit_config(c, intermediate_size=128)),
        ("tupe.layers.0.intermediate.bias has shape [64]", "implies [128]", "belong to different models"),
    ),
    Case(
        "glue-weights-missing-layer",
        "config.json with more layers than the weights hold",
        lambda c: c.glue(model=_edit_config(c, num_hidden_layers=3)),
        ("encoder tensor(s) that config.json implies are not in the weights", "tupe.layers.2."),
    ),
    Case(
        "glue-run-in-progress",
        "`--model` is a pre-training folder whose run has not finished (checkpoints only)",
        lambda c: c.glue(model=_unfinished_run(c)),
        ("no model weights", "a pre-training run not finished yet? use --model", "checkpoint-4"),
    ),
    Case(
        "glue-weights-pickle",
        "only pytorch_model.bin (pickle) weights",
        _bin_only,
        ("only pickle weights", "save_pretrained"),
    ),
    Case(
        "glue-no-tokenizer",
        "checkpoint folder without tokenizer files",
        lambda c: c.glue(model=(lambda m: [p.unlink() for p in m.glob("tokenizer*")] and m)(c.copy_model())),
        ("no tokenizer files",),
    ),
    Case(
        "glue-too-long",
        "`--max-seq-len` longer than the model allows",
        lambda c: c.glue("--max-seq-len", "4096"),
        ("--max-seq-len 4096 exceeds", "max_position_embeddings 64"),
    ),
    Case(
        "glue-seeds-out-of-range",
        "`--seeds` beyond what numpy and torch can seed",
        lambda c: c.glue("--seeds", "1,5000000000"),
        ("--seeds", "from 0 to 4294967295", "1,5000000000"),
    ),
    Case(
        "glue-lrs-not-numbers",
        "`--lrs` that are not numbers",
        lambda c: c.glue("--lrs", "fast"),
        ("--lrs", "expected comma-separated numbers"),
    ),
    Case(
        "glue-out-other-settings",
        "`--out` holds grid runs made with other settings",
        _other_glue_run,
        ("made with other settings", "--overwrite"),
    ),
    Case(
        "glue-no-dev-file",
        "task folder with train.tsv but no dev.tsv",
        lambda c: _glue_missing_dev(c),
        ("dev.tsv: no such file", "SST-2 layout"),
    ),
    Case(
        "glue-header-only",
        "TSV with a header and no examples",
        lambda c: _glue_file(c, "SST-2", "train.tsv", "sentence\tlabel\n"),
        ("train.tsv: no examples",),
    ),
    Case(
        "glue-tokenizer-corrupt",
        "checkpoint whose tokenizer.json is cut",
        lambda c: c.glue(model=_write(c.copy_model() / "tokenizer.json", '{"version": "1.0", "trunc').parent),
        ("cannot load a tokenizer", "JSONDecodeError"),
    ),
    # ------------------------------------------------------------------------------------------------ analyze
    Case(
        "analyze-model-missing",
        "`--model` that does not exist",
        lambda c: ["analyze", "--model", c.tmp / "none", "--out", c.tmp / "a"],
        ("--model", "no such folder"),
    ),
    Case(
        "analyze-model-type",
        "checkpoint of an unsupported model type",
        lambda c: [
            "analyze",
            "--model",
            _write(c.copy_model() / "config.json", '{"model_type": "gpt2"}').parent,
            "--out",
            c.tmp / "a",
        ],
        ("model_type 'gpt2' is not supported",),
    ),
    Case(
        "analyze-weights-truncated",
        "truncated model.safetensors",
        lambda c: [
            "analyze",
            "--model",
            (lambda m: _truncate(m / "model.safetensors") or m)(c.copy_model()),
            "--out",
            c.tmp / "a",
        ],
        ("corrupt or truncated safetensors file",),
    ),
    Case(
        "analyze-weights-config-mismatch",
        "config.json that does not fit the weights",
        lambda c: [
            "analyze",
            "--model",
            _edit_config(c, hidden_size=64, intermediate_size=64),
            "--out",
            c.tmp / "a",
        ],
        ("has shape", "belong to different models"),
    ),
    # ----------------------------------------------------------------------------------- plot, report, compare
    Case(
        "plot-bad-line",
        "metrics.jsonl with a malformed line in the middle",
        lambda c: [
            "plot",
            _write(c.tmp / "r" / "metrics.jsonl", '{"step": 1, "eval_loss": 5\n{"step": 2}\n').parent,
            "--out",
            c.tmp / "p.png",
        ],
        ("metrics.jsonl:1", "not a metrics record"),
    ),
    Case(
        "plot-not-a-run",
        "`tupe plot` on a folder that is not a run",
        lambda c: ["plot", c.tmp, "--out", c.tmp / "p.png"],
        ("no metrics.jsonl",),
    ),
    Case(
        "report-no-results",
        "`tupe report` on a folder without GLUE results",
        lambda c: ["report", c.tmp],
        ("no results.json under",),
    ),
    Case(
        "compare-unknown-scheme",
        "`tupe compare` with an unknown scheme",
        lambda c: ["compare", "--schemes", "tupe-a,tupe-b", "--out", c.tmp / "c"],
        ("unknown scheme 'tupe-b'",),
    ),
    # ---------------------------------------------------------------------------------------------------- CLI
    Case("command-unknown", "unknown command", lambda c: ["pretrian"], ("invalid choice: 'pretrian'",)),
    # ---------------------------------------------------------------------------------------- issue 14 cases
    Case(
        "corpus-elf",
        "an executable in the corpus folder",
        lambda c: c.pretrain(corpus=_corpus_with(c, "tool", b"\x7fELF\x02\x01\x01" + bytes(200))),
        ("corpus/tool", "is an ELF executable, not text"),
    ),
    Case(
        "corpus-control-bytes",
        "binary data without NUL bytes (control characters)",
        lambda c: c.pretrain(corpus=_corpus_with(c, "blob.txt", bytes(range(1, 32)) * 20)),
        ("blob.txt", "binary data", "not text"),
    ),
    Case(
        "corpus-fifo",
        "a FIFO inside the corpus folder",
        lambda c: c.pretrain(corpus=_folder_with_special(c, "pipe.txt", "fifo")),
        ("pipe.txt", "is a FIFO (named pipe), not a regular file"),
    ),
    Case(
        "corpus-dev-zero",
        "a symbolic link to /dev/zero inside the corpus folder",
        lambda c: c.pretrain(corpus=_folder_with_special(c, "zero.txt", "/dev/zero")),
        ("zero.txt", "symbolic link to /dev/zero", "character device"),
    ),
    Case(
        "corpus-broken-link",
        "a broken symbolic link inside the corpus folder",
        lambda c: c.pretrain(corpus=_folder_with_special(c, "gone.txt", "/nonexistent/file")),
        ("gone.txt", "broken symbolic link"),
    ),
    Case(
        "corpus-device-direct",
        "`--corpus /dev/zero`",
        lambda c: c.pretrain(corpus="/dev/zero"),
        ("/dev/zero", "character device"),
    ),
    Case(
        "valid-every-0",
        "`--valid-every 0`",
        lambda c: c.pretrain(valid_every=0),
        ("--valid-every", "an integer >= 2, got 0"),
    ),
    Case(
        "valid-every-1",
        "`--valid-every 1` (no training blocks)",
        lambda c: c.pretrain(valid_every=1),
        ("--valid-every", "an integer >= 2, got 1"),
    ),
    Case("grad-accum-0", "`--grad-accum 0`", lambda c: c.pretrain(grad_accum=0), ("--grad-accum", ">= 1")),
    Case(
        "threads-negative",
        "`--threads -2`",
        lambda c: c.pretrain(threads=-2),
        ("--threads", "from 1 to 1024, got -2"),
    ),
    Case(
        "hidden-size-0",
        "`--hidden-size 0`",
        lambda c: c.pretrain(hidden_size=0),
        ("--hidden-size", "from 1 to 65536"),
    ),
    Case(
        "num-heads-0",
        "`--num-heads 0`",
        lambda c: c.pretrain(num_heads=0),
        ("--num-heads", "from 1 to 65536"),
    ),
    Case("lr-nan", "`--lr nan`", lambda c: c.pretrain(lr="nan"), ("--lr", "finite number > 0")),
    Case("dropout-1", "`--dropout 1`", lambda c: c.pretrain(dropout=1), ("--dropout", ">= 0 and < 1")),
    Case(
        "mlm-probability-0",
        "`--mlm-probability 0`",
        lambda c: c.pretrain(mlm_probability=0),
        ("--mlm-probability", "> 0 and < 1"),
    ),
    Case("out-empty", '`--out ""`', lambda c: c.pretrain(out=""), ("--out", "empty string")),
    Case(
        "out-existing-file",
        "`--out` naming an existing file",
        _out_is_file,
        ("--out", "is a file, not a folder"),
    ),
    Case(
        "resume-missing-out",
        "`--resume` on a misspelled `--out`",
        lambda c: c.pretrain(out=c.tmp / "no-such-run", resume=True),
        ("--out", "no-such-run", "does not exist"),
    ),
    Case(
        "tokenizer-is-a-file",
        "`--tokenizer` given a file that is not tokenizer.json",
        lambda c: c.pretrain(tokenizer=_write(c.tmp / "vocab.txt", "a\nb\n")),
        ("vocab.txt", "is a file"),
    ),
    Case(
        "manifest-files-empty",
        'checkpoint manifests whose "files" is empty',
        lambda c: _bad_manifest(c, {}),
        ("--resume", "no complete checkpoint"),
    ),
    Case(
        "manifest-files-list",
        'checkpoint manifests whose "files" is a list',
        lambda c: _bad_manifest(c, ["model.safetensors"]),
        ("--resume", "no complete checkpoint"),
    ),
    Case(
        "optimizer-pickled-object",
        "optimizer.pt holding a pickled object (refused by weights_only)",
        _pickled_optimizer,
        ("optimizer.pt", "weights_only"),
    ),
    Case(
        "second-writer",
        "a second `tupe pretrain` on an --out another process is writing",
        _overwrite_after_a_second_writer,
        ("another `tupe pretrain` is writing here", "pid"),
    ),
    Case(
        "glue-adam-betas",
        "`--adam-betas` that are not numbers",
        lambda c: c.glue("--adam-betas", "0.9,fast"),
        ("--adam-betas", "comma-separated numbers"),
    ),
    Case(
        "glue-train-file-folder",
        "`--train-file` naming a folder",
        lambda c: c.glue("--train-file", c.tmp),
        ("--train-file", "is a folder, expected a file"),
    ),
    # ----------------------------------------------------------------------------------------- evaluate, analyze
    Case(
        "evaluate-second-writer",
        "a second `tupe evaluate` writing the `--json` file another process is writing",
        lambda c: _locked(
            c, "file_lock", c.tmp / "eval.json", "tupe evaluate", c.evaluate("--json", c.tmp / "eval.json")
        ),
        ("eval.json: another `tupe evaluate` is writing it", "pid"),
    ),
    Case(
        "evaluate-json-folder",
        "`tupe evaluate --json` naming a folder",
        lambda c: c.evaluate("--json", c.tmp),
        ("--json", "is a folder, expected a file"),
    ),
    Case(
        "evaluate-json-proc",
        "`tupe evaluate --json /proc/nope.json` (was: blamed on another `tupe evaluate` when run as root)",
        lambda c: c.evaluate("--json", "/proc/nope.json"),
        ("--json /proc/nope.json: cannot write there, /proc is not writable",),
    ),
    Case(
        "evaluate-bootstrap-negative",
        "`tupe evaluate --bootstrap -1`",
        lambda c: c.evaluate("--bootstrap", "-1"),
        ("argument --bootstrap: must be an integer from 0 to 100000, got -1",),
    ),
    Case(
        "analyze-second-writer",
        "a second `tupe analyze` on an `--out` another process is writing",
        lambda c: _locked(
            c,
            "folder_lock",
            c.tmp / "a",
            "tupe analyze",
            ["analyze", "--model", c.glue_model, "--out", c.tmp / "a"],
        ),
        ("another `tupe analyze` is writing here", "pid"),
    ),
    Case(
        "analyze-max-seq-len-3",
        "`tupe analyze --max-seq-len 3`",
        lambda c: ["analyze", "--model", c.glue_model, "--out", c.tmp / "a", "--max-seq-len", "3"],
        ("argument --max-seq-len: must be an integer from 4 to 1048576, got 3",),
    ),
]

# Hostile config.json values (issue 26): each refused before a model is built, in one line naming the field.
_HOSTILE_CONFIG = [
    ("num_attention_heads", 0, "num_attention_heads must be an integer from 1"),
    ("num_attention_heads", 3, "hidden_size 32 is not a multiple of num_attention_heads 3"),
    ("hidden_size", "32", "hidden_size must be an integer from 1 to 65536, got a string '32'"),
    ("hidden_size", -32, "hidden_size must be an integer from 1 to 65536, got -32"),
    ("num_hidden_layers", 2.5, "num_hidden_layers must be an integer from 1 to 1024, got a number 2.5"),
    ("num_hidden_layers", 0, "num_hidden_layers must be an integer"),
    ("intermediate_size", None, "intermediate_size must be an integer from 1 to 1048576, got null"),
    ("vocab_size", 10**12, "vocab_size must be an integer from 1 to"),
    ("max_position_embeddings", 0, "max_position_embeddings must be an integer"),
    ("hidden_act", "bogus_act", "hidden_act 'bogus_act' is not an activation"),
    ("hidden_act", ["gelu"], "hidden_act ['gelu'] is not an activation"),
    ("dtype", "bogus", "dtype 'bogus' is not a dtype"),
    ("torch_dtype", 7, "torch_dtype 7 is not a dtype"),
    ("pad_token_id", 10**6, "pad_token_id 1000000 is not a token id of the vocabulary"),
    ("cls_token_id", -1, "cls_token_id -1 is not a token id"),
    ("layer_norm_eps", -1, "layer_norm_eps must be a finite number > 0"),
    ("hidden_dropout_prob", 1.5, "hidden_dropout_prob must be a finite number >= 0 and < 1"),
    ("attention_probs_dropout_prob", "0.1", "attention_probs_dropout_prob must be a finite number"),
    ("position_scheme", "tupe-z", "position_scheme 'tupe-z' is not one of"),
    ("relative_attention_num_buckets", 0, "relative_attention_num_buckets must be an integer from 1"),
    ("model_type", None, "no model_type"),
    ("id2label", [1, 2], "id2label must be an object, got a list"),
]


def _config_holding(ctx: Ctx, text: str) -> Path:
    m = ctx.copy_model()
    (m / "config.json").write_text(text)
    return m


CASES += [
    Case(
        f"config-{key}-{str(value)[:12]}",
        f"config.json with `{key}: {json.dumps(value)}`",
        (lambda k, v: lambda c: c.glue(model=_edit_config(c, **{k: v})))(key, value),
        ("config.json", needle),
    )
    for key, value, needle in _HOSTILE_CONFIG
] + [
    Case(
        "config-null",
        "config.json holding `null`",
        lambda c: c.glue(model=_config_holding(c, "null")),
        ("config.json: expected a JSON object (model config), got null",),
    ),
    Case(
        "config-deeply-nested",
        "config.json holding a 200,000-deep nested array",
        lambda c: c.evaluate_model(_config_holding(c, "[" * 200_000 + "]" * 200_000)),
        ("config.json: JSON nested too deeply",),
    ),
    Case(
        "config-fifo",
        "config.json that is a FIFO (`tupe analyze`)",
        lambda c: ["analyze", "--model", _fifo_config(c), "--out", c.tmp / "a"],
        ("config.json: a FIFO (named pipe), not a regular file",),
    ),
    Case(
        "tokenizer-custom-code",
        "tokenizer_config.json whose auto_map names a .py in the folder",
        lambda c: c.glue(model=_custom_code_model(c)),
        ("tokenizer_config.json: auto_map asks to run custom code", "evil_tok.py", "tupe never runs code"),
    ),
]

# values that multiply memory or time: refused when parsed, or before any work by a memory estimate
CASES += [
    Case("max-steps-huge", "`--max-steps 10^24`", lambda c: c.pretrain(max_steps=10**24),
         ("argument --max-steps: must be an integer from 1 to 2147483647",)),
    Case("hidden-size-huge", "`--hidden-size 1000000`", lambda c: c.pretrain(hidden_size=1_000_000),
         ("argument --hidden-size: must be an integer from 1 to 65536",)),
    Case("vocab-size-huge", "`--vocab-size 100000000000`", lambda c: c.pretrain(tokenizer=None, vocab_size=10**11),
         ("argument --vocab-size: must be an integer from 8 to 4194304",)),
    Case("threads-huge", "`--threads 100000`", lambda c: c.pretrain(threads=100_000),
         ("argument --threads: must be an integer from 1 to 1024",)),
    Case("model-beyond-memory", "`--hidden-size 65536 --num-layers 1024` (more memory than the machine has)",
         lambda c: c.pretrain(hidden_size=65536, num_layers=1024, num_heads=64, intermediate_size=65536),
         ("--hidden-size 65536, --num-layers 1024", "GiB of memory, more than this machine's")),
    Case("bench-shape-huge", "`tupe bench --shape 1x10000000`",
         lambda c: ["bench", "--shape", "1x10000000", "--schemes", "bert-a"],
         ("--shape '1x10000000': layers must be from 1 to 1024 and width from 1 to 65536",)),
    Case("bench-seq-len-huge", "`tupe bench --seq-len 100000000`", lambda c: ["bench", "--seq-len", "100000000"],
         ("argument --seq-len: must be an integer from 2 to 1048576",)),
    Case("bench-seq-len-beyond-memory", "`tupe bench --seq-len 1000000` (attention scores beyond memory)",
         lambda c: ["bench", "--seq-len", "1000000", "--preset", "mini", "--schemes", "bert-a"],
         ("--seq-len 1000000", "GiB of memory, more than this machine's")),
    Case("bench-device-bogus", "`tupe bench --device 'cuda:99;rm'`", lambda c: ["bench", "--device", "cuda:99;rm"],
         ("--device 'cuda:99;rm' is not a device",)),
    Case("plot-negative-step", "`tupe plot` of a metrics.jsonl with a negative step",
         lambda c: ["plot", _write(c.tmp / "r" / "metrics.jsonl", '{"step": -3, "eval_loss": 1.0}\n').parent,
                    "--out", c.tmp / "p.png"],
         ("metrics.jsonl:1: step -3 is negative",)),
]  # fmt: skip


def _nan_weights(ctx: Ctx) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    m = ctx.copy_model()
    tensors = load_file(m / "model.safetensors")
    name = next(k for k in tensors if k.endswith("query.weight") or "query" in k)
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, m / "model.safetensors", metadata={"format": "pt"})
    return m


CASES += [
    Case("glue-nan-weights", "a model whose weights hold NaN (`tupe glue`)",
         lambda c: c.glue("--max-train-samples", "8", "--max-eval-samples", "4", model=_nan_weights(c)),
         ("is not finite (NaN or inf); refusing to fine-tune this model",)),
]  # fmt: skip


def _convert(
    ctx: Ctx, checkpoint: Path | None = None, dict_txt: Path | None = None, drop: str = "", nan: bool = False
) -> list:
    """`tupe convert fairseq` of a small checkpoint of the released layout (tests/convert/released.py) with its
    dictionary and BPE codes; `checkpoint` / `dict_txt` replace the good ones; `drop`: a tensor left out of the
    good checkpoint; `nan`: every weight of it NaN."""
    import torch

    from tests.convert.bpe import write_codes_and_dict
    from tests.convert.released import fairseq_args, random_state_dict, save_checkpoint
    from tupe.modeling.fairseq import read_dict_txt

    folder = ctx.tmp / "fs"
    folder.mkdir(parents=True, exist_ok=True)
    codes, good_dict, _ = write_codes_and_dict(folder)
    if checkpoint is None:
        args = fairseq_args()
        sd = random_state_dict(args, 7 + len(read_dict_txt(good_dict)) + 1)
        sd.pop(drop, None)
        if nan:
            sd = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in sd.items()}
        checkpoint = folder / "checkpoint_best.pt"
        save_checkpoint(checkpoint, args, sd)
    return [
        "convert", "fairseq", checkpoint, "--dict", dict_txt or good_dict, "--bpe-codes", codes,
        "--out", ctx.tmp / "converted",
    ]  # fmt: skip


def _folder(ctx: Ctx, name: str) -> Path:
    (ctx.tmp / name).mkdir(parents=True, exist_ok=True)
    return ctx.tmp / name


CASES += [
    Case("convert-text-file", "`tupe convert fairseq` of a plain text file",
         lambda c: _convert(c, checkpoint=_write(c.tmp / "notes.txt", "hello world\nthis is text\n")),
         ("notes.txt: not a torch checkpoint (a text file",)),
    Case("convert-missing-tensor", "a fairseq checkpoint missing a tensor (the error starts with its path)",
         lambda c: _convert(c, drop="decoder.sentence_encoder.layers.1.fc2.bias"),
         ("fs/checkpoint_best.pt: missing tensor decoder.sentence_encoder.layers.1.fc2.bias",)),
    Case("convert-nan-weights", "a fairseq checkpoint whose weights are all NaN",
         lambda c: _convert(c, nan=True),
         ("checkpoint_best.pt: tensor decoder.sentence_encoder.embed_tokens.weight holds non-finite weights",)),
    Case("convert-dict-folder", "`tupe convert fairseq --dict` a folder",
         lambda c: _convert(c, dict_txt=_folder(c, "ft")),
         ("--dict", "ft: a folder, not a file")),
]  # fmt: skip


def _finetune(ctx: Ctx, task: str, train: Path, valid: Path | None = None) -> list:
    return [
        "finetune", "--task", task, "--model", ctx.glue_model, "--train", train, "--validation", valid or train,
        "--out", ctx.tmp / "ft", "--lrs", "1e-4", "--seeds", "1", "--epochs", "1",
    ]  # fmt: skip


def _squad(ctx: Ctx, answers: object, context: str = "Paris is in France.") -> list:
    qa = {"id": "q1", "question": "Where is Paris?", "answers": answers}
    data = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}]}
    return _finetune(ctx, "qa", _write(ctx.tmp / "squad.json", json.dumps(data)))


def _catastrophic_regex(ctx: Ctx) -> Path:
    m = ctx.copy_model()
    data = json.loads((m / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": "(a+)+$"},
        "behavior": "Isolated",
        "invert": False,
    }
    (m / "tokenizer.json").write_text(json.dumps(data))
    return m


# issue 38: inputs an outside audit found ending in a traceback, a memory blow-up or a silently wrong score
CASES += [
    Case("squad-answer-start-negative", "SQuAD answer with a negative `answer_start` (`tupe finetune --task qa`)",
         lambda c: _squad(c, [{"text": "France.", "answer_start": -7}]),
         ("--train ", "squad.json: question 'q1'", "answer_start -7, outside its context of 19 characters")),
    Case("squad-answers-object", "SQuAD `answers` an object instead of a list",
         lambda c: _squad(c, {"text": "France", "answer_start": 12}),
         ("--train ", "squad.json: question 'q1': 'answers' is an object, expected a list",)),
    Case("squad-deeply-nested", "SQuAD JSON nested 100,000 levels deep",
         lambda c: _finetune(c, "qa", _write(c.tmp / "deep.json", '{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")),
         ("--train ", "deep.json: JSON nested too deeply to be read",)),
    Case("classification-text-null", 'classification JSONL with `"text": null`',
         lambda c: _finetune(c, "classification", _write(c.tmp / "cls.jsonl", '{"text": "good", "label": "pos"}\n'
                                                         '{"text": null, "label": "neg"}\n')),
         ("--train ", "cls.jsonl:2: 'text' is null; expected a sentence",)),
    Case("classification-label-list", 'classification JSONL with a list label `["pos"]`',
         lambda c: _finetune(c, "classification", _write(c.tmp / "cls.jsonl", '{"text": "good", "label": ["pos"]}\n'
                                                         '{"text": "bad", "label": "neg"}\n')),
         ("--train ", 'cls.jsonl:1: label ["pos"] is a list; expected one label',)),
    Case("classification-label-empty-csv", "classification CSV with an empty label cell (was: a class `''` of its own)",
         lambda c: _finetune(c, "classification", _write(c.tmp / "cls.csv", "text,label\ngood,pos\nbad,neg\nmeh,\n")),
         ("--train ", "cls.csv:4: empty label ''; every example needs one",)),
    Case("classification-label-blank-tsv", "classification TSV with a label of one space",
         lambda c: _finetune(c, "classification", _write(c.tmp / "cls.tsv", "text\tlabel\ngood\tpos\nbad\t \n")),
         ("--train ", "cls.tsv:3: empty label ' '",)),
    Case("classification-label-empty-jsonl", 'classification JSONL with `"label": ""`',
         lambda c: _finetune(c, "classification", _write(c.tmp / "cls.jsonl", '{"text": "good", "label": "pos"}\n'
                                                         '{"text": "bad", "label": ""}\n')),
         ("--train ", "cls.jsonl:2: empty label ''",)),
    Case("report-to-bogus-pretrain", "`--report-to bogus` (`tupe pretrain`; was: found after the data and the model)",
         lambda c: c.pretrain(report_to="bogus"),
         ("--report-to: unknown integration 'bogus'; choose from", "wandb")),
    Case("report-to-bogus-glue", "`--report-to tensorboard,bogus` (`tupe glue`)",
         lambda c: c.glue("--report-to", "tensorboard,bogus"),
         ("--report-to: unknown integration 'bogus'",)),
    Case("tokenizer-catastrophic-regex", "a model folder's tokenizer.json with the regex `(a+)+$` (`tupe evaluate`)",
         lambda c: ["evaluate", "--model", _catastrophic_regex(c),
                    "--text", _write(c.tmp / "a.txt", "a" * 50_000 + "b\n")],
         ("tokenizer.json: regex '(a+)+$' repeats a group that repeats",)),
    Case("pretrain-batch-beyond-memory", "`tupe pretrain --batch-size 100000` (activations beyond memory)",
         lambda c: c.pretrain(batch_size=100_000),
         ("--batch-size 100000", "GiB of memory, more than this machine's")),
    Case("evaluate-length-beyond-memory", "`tupe evaluate --lengths 65536 --extend-positions interpolate`",
         lambda c: ["evaluate", "--model", c.glue_model, "--extend-positions", "interpolate", "--lengths", "65536",
                    "--text", _write(c.tmp / "long.txt", "the cat sat on the mat and looked at the door.\n" * 8000)],
         ("--lengths 65536 with --extend-positions interpolate", "GiB of memory, more than this machine's")),
]  # fmt: skip


def _full_disk_at_tokenizer_cache(ctx: Ctx) -> list:
    """`tupe pretrain` training its tokenizer while the disk fills up as the tokenizer is cached: the tokenizers
    library writes part of tokenizer.json, then raises a plain `Exception("No space left on device (os error 28)")`
    (not an OSError), as it does on a full disk. The save is replaced for the case only (undone by `cleanup`)."""
    from transformers import PreTrainedTokenizerFast

    real = PreTrainedTokenizerFast.save_pretrained

    def full(self, save_directory, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        _write(Path(save_directory) / "tokenizer.json", '{"version": "1.0", "trunc')
        raise Exception("No space left on device (os error 28)")  # noqa: TRY002 - what the library raises

    PreTrainedTokenizerFast.save_pretrained = full  # type: ignore[method-assign]
    ctx.cleanup.append(lambda: setattr(PreTrainedTokenizerFast, "save_pretrained", real))
    argv = [str(a) for a in ctx.pretrain(cache_dir=ctx.tmp / "cache")]
    at = argv.index("--tokenizer")
    return argv[:at] + argv[at + 2 :]  # no --tokenizer: one is trained and cached


# issue 38, the tokenizer cache: a full disk while caching the trained tokenizer was a traceback
CASES += [
    Case("tokenizer-cache-disk-full", "disk full while the trained tokenizer is cached (`tupe pretrain`)",
         _full_disk_at_tokenizer_cache,
         ("No space left on device", "the trained tokenizer was not cached (partial files removed)",
          "free space or use another --cache-dir")),
]  # fmt: skip


def _fifo_config(ctx: Ctx) -> Path:
    m = ctx.copy_model()
    (m / "config.json").unlink()
    os.mkfifo(m / "config.json")
    return m


def _custom_code_model(ctx: Ctx) -> Path:
    m = ctx.copy_model()
    (m / "evil_tok.py").write_text(f"open({str(ctx.tmp / 'RAN')!r}, 'w').write('ran')\n")
    cfg = json.loads((m / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}
    (m / "tokenizer_config.json").write_text(json.dumps(cfg))
    return m


def _locked(ctx: Ctx, kind: str, path: Path, command: str, argv: list) -> list:
    """`argv`, run while another live process running the same command holds `kind` (folder_lock / file_lock) on
    `path`."""
    from tests.helpers import hold_lock

    proc = hold_lock(kind, path, command, argv)
    ctx.cleanup.append(proc.kill)
    ctx.cleanup.append(proc.wait)
    return argv


def _dataset(ctx: Ctx) -> Path:
    import datasets

    path = ctx.tmp / "ds"
    datasets.Dataset.from_dict({"body": ["some text"] * 4}).save_to_disk(str(path))
    return path


@dataclass
class ApiCase:
    """A bad input of the Python API: the call must raise `error` with one line holding every needle."""

    id: str
    what: str  # the bad input, in words (a row of the docs table)
    call: Callable[[Ctx], object]  # makes the bad call
    api: str  # the API called, as the docs table names it
    error: type[Exception]
    needles: tuple[str, ...]


def _qa_pipeline(ctx: Ctx) -> object:
    import transformers

    import tupe  # noqa: F401  (registers pipeline("question-answering"))

    model = transformers.AutoModelForQuestionAnswering.from_pretrained(ctx.glue_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(ctx.glue_model)
    return transformers.pipeline("question-answering", model=model, tokenizer=tokenizer, device="cpu")


# issue 38: the question-answering pipeline given an integer context raised TypeError: 'int' object is not iterable
API_CASES: list[ApiCase] = [
    ApiCase("qa-pipeline-integer-context", "an integer `context`",
            lambda c: _qa_pipeline(c)(question="When?", context=42), 'pipeline("question-answering")', ValueError,
            ("question-answering pipeline: context must be a string or a non-empty list of strings, got int 42",)),
    ApiCase("qa-pipeline-integer-in-questions", "a list of questions holding an integer",
            lambda c: _qa_pipeline(c)(question=["When?", 7], context="Paris opened in 1931."),
            'pipeline("question-answering")', ValueError,
            ("question-answering pipeline: question must be a string or a non-empty list of strings, got list",)),
    ApiCase("rope-parameters-on-a-table-scheme", "`rope_parameters` (RoPE scaling) on a scheme without rotation",
            lambda c: _from_pretrained(c.glue_model, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
            "TupeForMaskedLM.from_pretrained(tupe-a folder, rope_parameters=...)", ValueError,
            ("applies to the rope scheme only (rotary positions); position_scheme 'tupe-a' has no rotation to scale",)),
    ApiCase("rope-parameters-unknown-type", "a `rope_type` the rope scheme does not apply",
            lambda c: _rope_config(rope_parameters={"rope_type": "ntk-by-parts", "factor": 4.0}),
            'TupeConfig(position_scheme="rope", rope_parameters=...)', ValueError,
            ("rope_type 'ntk-by-parts' is not one the rope scheme applies (default, linear, dynamic, yarn",)),
    ApiCase("rope-parameters-set-after-build", "`config.rope_parameters` set on a built model, then saved",
            lambda c: _save_claiming_yarn(c), "model.save_pretrained(DIR)", ValueError,
            ("is not what this model applies", "changed after the model was built")),
    ApiCase("diagnose-a-too-small-vocabulary", "a model of one's own whose embedding is smaller than the tasks' ids",
            lambda c: _diagnose_small_model(), "tupe.diagnostics.run.diagnose_model(model, vocab)", ValueError,
            ("cannot read the tasks' token ids", "they need a vocabulary of at least", "fresh_vocabulary(settings).size")),
]  # fmt: skip


def _diagnose_small_model() -> object:
    import torch

    from tupe.diagnostics.run import Settings, diagnose_model, fresh_vocabulary

    settings = Settings(multiples=(1,), test_examples=8)
    vocab = fresh_vocabulary(settings)

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab.size - 8, vocab.size)

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
        ) -> torch.Tensor:
            return self.embed(input_ids)

    return diagnose_model(Small(), vocab, settings, name="small")


def _from_pretrained(folder: Path, **kwargs: object) -> object:
    from tupe import TupeForMaskedLM

    return TupeForMaskedLM.from_pretrained(folder, **kwargs)


def _rope_config(**kwargs: object) -> object:
    from tupe import TupeConfig

    return TupeConfig(position_scheme="rope", hidden_size=16, num_attention_heads=2, **kwargs)


def _save_claiming_yarn(ctx: Ctx) -> None:
    from tupe import TupeForMaskedLM

    model = TupeForMaskedLM(_rope_config(num_hidden_layers=1, intermediate_size=32, vocab_size=40))
    model.config.rope_parameters = {"rope_type": "yarn", "factor": 4.0}
    model.save_pretrained(ctx.tmp / "claims-yarn")


def api_markdown_table(ctx: Ctx) -> str:
    """Run every Python API case and return its docs table."""
    rows = ["| bad input | call | error (one line) | test |", "|---|---|---|---|"]
    for case in API_CASES:
        try:
            case.call(ctx)
            line = "(no error)"
        except case.error as err:
            line = f"{type(err).__name__}: {err}"
        rows.append(
            f"| {case.what} | `{case.api}` | `` {line} `` | `test_bad_inputs.py::test_bad_python_input[{case.id}]` |"
        )
    return "\n".join(rows)


def markdown_table(ctx: Ctx) -> str:
    """Run every case and return the docs table (message with the scratch folder shown as DIR)."""
    import contextlib
    import io

    from tupe.cli import main

    rows = ["| bad input | command | message (one line, exit code 2) | test |", "|---|---|---|---|"]
    for case in CASES:
        case_tmp = ctx.tmp / case.id
        case_tmp.mkdir(parents=True, exist_ok=True)
        c = Ctx(
            case_tmp, ctx.corpus, ctx.tokenizer, ctx.cache, ctx.finished_run, ctx.glue_model, ctx.glue_data
        )
        try:
            argv = [str(a) for a in case.make(c)]
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
        finally:
            for fn in c.cleanup:
                fn()
        line = next(
            (ln for ln in err.getvalue().splitlines() if ": error: " in ln), f"(no error, exit {code})"
        )
        for path, name in ((case_tmp, "DIR"), (ctx.glue_model, "MODEL"), (ctx.glue_data, "GLUE"),
                           (ctx.tokenizer, "TOK"), (ctx.corpus, "CORPUS"), (ctx.cache, "CACHE")):  # fmt: skip
            line = line.replace(str(path), name)
        rows.append(
            f"| {case.what} | `tupe {argv[0]}` | `` {line} `` | `test_bad_inputs.py::test_bad_input[{case.id}]` |"
        )
    return "\n".join(rows)


if __name__ == "__main__":  # python -m tests.reliability.bad_inputs  > the table of docs/reliability.md
    import tempfile

    from tests.glue.fixtures import make_checkpoint, write_task
    from tupe.cli import main as cli_main
    from tupe.data import resolve_corpus, train_tokenizer

    from .conftest import pretrain_args, write_corpus

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        corpus = write_corpus(root / "corpus")
        tok = root / "tok"
        train_tokenizer(resolve_corpus([str(corpus)]), vocab_size=300, show_progress=False).save_pretrained(
            tok
        )
        run = root / "finished"
        assert cli_main([str(a) for a in pretrain_args(corpus, tok, root / "cache", run, max_steps=4)]) == 0
        model = make_checkpoint(root / "model")
        for task in ("SST-2", "STS-B", "MRPC"):
            write_task(root / "glue", task, n_train=16, n_dev=8)
        cases = Ctx(root / "cases", corpus, tok, root / "cache", run, model, root / "glue")
        print(markdown_table(cases))
        print()
        print(api_markdown_table(cases))
