"""Convert a checkpoint of another code base into a tupe model folder.

`tupe convert fairseq CHECKPOINT --dict DICT --bpe-codes CODES --out DIR`: a checkpoint of the authors' released
TUPE code (fairseq format, e.g. the TUPE-R checkpoint of github.com/guolinke/TUPE) becomes a folder that
`AutoModelForMaskedLM`, `AutoTokenizer`, `tupe glue`, `tupe evaluate` and `tupe analyze` read. Its pickle is
loaded without running code. See docs/released-checkpoint.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tupe.errors import TupeError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    f = sub.add_parser(
        "fairseq",
        help="a checkpoint of the released TUPE code (fairseq format)",
        description="Convert a checkpoint of the authors' released TUPE code (fairseq) into a tupe model folder.",
    )
    f.add_argument(
        "checkpoint", help="the fairseq checkpoint (.pt), e.g. checkpoint_best.pt of tupe_ckp.tar.gz"
    )
    f.add_argument(
        "--dict",
        required=True,
        dest="dict_txt",
        metavar="DICT",
        help="the fairseq dictionary the checkpoint was trained with (dict.txt)",
    )
    f.add_argument("--bpe-codes", required=True, metavar="CODES", help="the fastBPE codes file (bpe-code)")
    f.add_argument(
        "--out", required=True, metavar="DIR", help="new folder to write (must not exist or be empty)"
    )
    f.add_argument(
        "--lowercase",
        action="store_true",
        help="lower-case text before Moses, as the released preprocessing did (for an uncased dictionary)",
    )


def run(args: argparse.Namespace) -> int:
    convert_fairseq_checkpoint(
        args.checkpoint, args.dict_txt, args.bpe_codes, args.out, lowercase=args.lowercase
    )
    return 0


# ------------------------------------------------------------------------------------------------ folder


def _card_notes(ckpt: str, state: dict[str, Any], dictionary: Any, lowercase: bool) -> str:
    args = state["args"]
    lines = [
        "## Source",
        "",
        f"Converted by `tupe convert fairseq` from the fairseq checkpoint `{Path(ckpt).name}` of the authors' "
        "released TUPE code (https://github.com/guolinke/TUPE; the TUPE-R checkpoint of its README is "
        "`tupe_ckp.tar.gz`). The encoder's outputs equal the released forward's (see `docs/released-checkpoint.md` "
        "of the `tupe` package); weights stored in float32 (float64 if the checkpoint's were), widened exactly "
        "from a half-precision checkpoint.",
        "",
        f"Tokenizer: Moses (`tokenizer.perl -no-escape -l en`, via sacremoses){' after lower-casing' if lowercase else ''}"
        f", the fastBPE codes, the fairseq dictionary `{Path(dictionary.path).name}` "
        f"({len(dictionary.specials)} specials, {len(dictionary.symbols) - len(dictionary.specials) - 1} entries, "
        "`<mask>` last). The released preprocessing also ran clean-up scripts (punctuation normalisation, "
        "non-printing characters, punctuation splitting, lower-casing) that this tokenizer does not.",
    ]
    act_dropout = float(getattr(args, "activation_dropout", 0.0) or 0.0)
    if act_dropout:
        lines += [
            "",
            f"The checkpoint was trained with `--activation-dropout {act_dropout}`, which tupe does not have "
            "(fine-tuning here applies no dropout after the FFN activation).",
        ]
    return "\n".join(lines)


def convert_fairseq_checkpoint(
    checkpoint: str | os.PathLike,
    dict_txt: str | os.PathLike,
    bpe_codes: str | os.PathLike,
    out_dir: str | os.PathLike,
    lowercase: bool = False,
    log: Any = print,
) -> Path:
    """Write a complete tupe model folder for a released checkpoint: safetensors, config, the released pipeline's
    tokenizer, a model card naming the source; each classification head as its own folder under `heads/NAME`.

    Written into a staging folder next to `out_dir` and renamed at the end, so a refusal leaves nothing behind and
    an existing folder is never touched."""
    from tupe.modeling.fairseq import (
        build_dictionary,
        build_tokenizer,
        classifiers_from_fairseq,
        load_fairseq_checkpoint,
        masked_lm_from_fairseq,
    )

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TupeError(f"--out {out} already exists and is not an empty folder; choose a new folder")
    state = load_fairseq_checkpoint(checkpoint)
    ckpt = str(checkpoint)
    model = masked_lm_from_fairseq(state, None, source=ckpt)
    config = model.config
    dictionary = build_dictionary(dict_txt, config.vocab_size)
    tokenizer = build_tokenizer(dictionary, bpe_codes, lowercase, config.max_position_embeddings)
    heads = classifiers_from_fairseq(state, source=ckpt)
    steps = None
    history = state.get("optimizer_history")
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        steps = history[-1].get("num_updates")
    for m in [model, *heads.values()]:
        m.config.fairseq_checkpoint = Path(ckpt).name
        if isinstance(steps, int):
            m.config.pretrain_steps = steps
    _log_conversion(config, dictionary, heads, state, lowercase, log)
    folder = _ConvertedFolder(out, config, ckpt, state, dictionary, tokenizer, lowercase, steps)
    _write_staged(out, lambda staging: folder.write_all(staging, model, heads))
    log(f"convert: wrote {out} (model.safetensors, config.json, tokenizer, README.md)")
    return out


def _log_conversion(
    config: Any, dictionary: Any, heads: dict, state: dict, lowercase: bool, log: Any
) -> None:
    """What was converted, in one line, and the notes a user must see (no activation dropout here; an uncased
    dictionary without --lowercase)."""
    log(
        f"convert: {config.position_scheme}, {config.num_hidden_layers} layers x {config.hidden_size} hidden, "
        f"{config.num_attention_heads} heads, {config.max_position_embeddings} positions, vocabulary "
        f"{config.vocab_size} ({len(dictionary.specials)} fairseq specials, <mask> = {config.mask_token_id})"
        + (f", {len(heads)} classification head(s): {', '.join(heads)}" if heads else "")
    )
    if float(getattr(state["args"], "activation_dropout", 0.0) or 0.0):
        log(
            f"convert: note: --activation-dropout {state['args'].activation_dropout} has no tupe counterpart "
            "(no effect on outputs; fine-tuning here has no dropout after the FFN activation)"
        )
    uncased = not any(ch.isupper() for s in dictionary.symbols for ch in s)
    if uncased and not lowercase:
        log(
            "convert: note: the dictionary has no upper-case entry (the released preprocessing lower-cases its text); "
            "pass --lowercase to lower-case input text before Moses"
        )


@dataclass(frozen=True)
class _ConvertedFolder:
    """What every folder of a conversion holds: the model, the tokenizer, a model card naming the source."""

    out: Path
    config: Any  # the masked LM's: every card describes it
    ckpt: str
    state: dict
    dictionary: Any
    tokenizer: Any
    lowercase: bool
    steps: Any

    def write_all(self, staging: Path, model: Any, heads: dict) -> None:
        self.write(staging, model, "fill-mask")
        for name, head in heads.items():
            (staging / "heads" / name).mkdir(parents=True)
            self.write(staging / "heads" / name, head, "text-classification")

    def write(self, folder: Path, m: Any, kind: str) -> None:
        from tupe.io.model_card import model_card

        config = self.config
        m.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        recipe = {
            "source": f"fairseq checkpoint {Path(self.ckpt).name} (guolinke/TUPE)",
            "pre-training updates": self.steps,
            "layers x hidden x heads": f"{config.num_hidden_layers} x {config.hidden_size} x {config.num_attention_heads}",
            "max positions": config.max_position_embeddings,
            "vocabulary": f"{config.vocab_size} (fairseq dictionary)",
        }
        card = model_card(
            kind=kind,
            scheme=config.position_scheme,
            recipe=recipe,
            metrics={},
            data="The authors' pre-training data (the paper: English Wikipedia + BookCorpus, 16 GB).",
            model_path=str(self.out),
            notes=_card_notes(self.ckpt, self.state, self.dictionary, self.lowercase),
            mask_token=self.tokenizer.mask_token,
        )
        (folder / "README.md").write_text(card, encoding="utf-8")


def _write_staged(out: Path, write: Any) -> None:
    """`write(staging)` into a fresh folder next to `out`, renamed to `out` when complete; a failure removes it
    and names --out (read-only, disk full), not the hidden staging folder."""
    from transformers.utils import logging as hf_logging

    from tupe.io.files import is_write_failure, write_error

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    except OSError as err:
        raise write_error(f"--out {out}", err, "nothing was written") from None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "writing shards" bar per small file is noise
    try:
        write(staging)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(staging, out)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, Exception) and not isinstance(err, TupeError) and is_write_failure(err):
            raise write_error(f"--out {out}", err, "nothing was written (partial files removed)") from None
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
