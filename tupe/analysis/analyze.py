"""Draw the paper's analysis figures for a checkpoint: the four-term split of the first layer's logits (Fig. 2)
for models that add positions to the input, and each head's content-free attention pattern (Fig. 6) for models
with a positional logit term. Writes PNGs, analysis.json and a self-contained analysis.html.

Works on TUPE checkpoints and on `transformers` BERT directories (converted exactly to bert-a).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tupe import validators as V
from tupe.errors import TupeError
from tupe.io.outputs import RECORD_NAME, OutputFolder, read_record, update_record
from tupe.training.flags import add_training_flags

if TYPE_CHECKING:  # torch and the analysis modules are imported where used: `tupe analyze --help` stays fast
    import torch

    from .patterns import PatternThresholds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        type=V.nonempty_path,
        help="model directory (TUPE checkpoint or transformers BERT)",
    )
    parser.add_argument(
        "--text",
        metavar="PATH",
        type=V.nonempty_path,
        help="text file (or directory of .txt files) to draw blocks from; needed for "
        "the word/position split, optional for TUPE's content-free patterns",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", type=V.nonempty_path, help="output directory (created)"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        type=V.nonempty_path,
        help="tokenizer directory, if the model directory has none",
    )
    add_training_flags(
        parser,
        ["max_seq_len"],
        defaults={"max_seq_len": 128},
        dests={"max_seq_len": "max_length"},
        helps={"max_seq_len": "a block of text; default 128, capped at the model's max_position_embeddings"},
        types={"max_seq_len": V.int_range(4, V.MAX_LENGTH)},
    )
    parser.add_argument(
        "--num-blocks", type=V.positive_int, default=32, help="blocks of text to average over (default 32)"
    )
    parser.add_argument(
        "--batch-size", type=V.positive_int, default=8, help="blocks per forward pass (default 8)"
    )
    parser.add_argument(
        "--zoom", type=V.positive_int, default=32, help="positions shown in the zoomed pattern grid"
    )
    parser.add_argument(
        "--max-offset", type=V.positive_int, default=16, help="offsets shown in the offset profile"
    )
    parser.add_argument(
        "--no-json-maps",
        action="store_true",
        help="leave the n x n maps out of analysis.json (keeps only the numbers; much smaller)",
    )
    parser.add_argument("--title", help="name used in figure titles (default: the model directory's name)")
    V.add_threads_progress(parser, "progress bars (loading a model)")
    V.annotate_ranges(parser)


def _round(t: torch.Tensor, digits: int = 5):
    import torch

    return torch.round(t.double() * 10**digits).div(10**digits).tolist()


def analyze(
    model_dir: str | Path,
    out_dir: str | Path,
    text: str | Path | None = None,
    tokenizer: str | Path | None = None,
    max_length: int = 128,
    num_blocks: int = 32,
    batch_size: int = 8,
    zoom: int = 32,
    max_offset: int = 16,
    title: str | None = None,
    thresholds: PatternThresholds | None = None,
    json_maps: bool = True,
) -> dict:
    """Run the analysis and write its files; returns the JSON-able result (also in `out_dir/analysis.json`)."""
    import torch

    from tupe.modeling.positional import scheme_class

    from .loading import load_encoder
    from .patterns import DEFAULT_THRESHOLDS

    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    if max_length < 4 or num_blocks < 1 or batch_size < 1:
        raise TupeError(
            f"--max-seq-len must be >= 4 and --num-blocks, --batch-size >= 1 (got {max_length}, "
            f"{num_blocks}, {batch_size})"
        )
    encoder, description = load_encoder(model_dir)
    config = encoder.config
    scheme = config.position_scheme
    n = min(max_length, config.max_position_embeddings)
    title = title or Path(model_dir).resolve().name
    result: dict = {
        "title": title,
        "model": str(model_dir),
        "description": description,
        "position_scheme": scheme,
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_heads": config.num_attention_heads,
        "seq_len": n,
    }
    with torch.no_grad():
        positional = encoder.positional_logits(n)
    does_split = scheme_class(scheme).report.decomposable
    if not does_split and positional is None:
        raise TupeError(
            f"position_scheme {scheme!r} has neither input positions to split nor a content-free "
            "logit term to draw; nothing to analyse"
        )
    if does_split and positional is None and text is None:
        raise TupeError(f"position_scheme {scheme!r}: the word/position split needs --text")

    figures: dict[str, bytes] = {}
    if text is not None:
        sample = _Sample(text, tokenizer, model_dir, n, num_blocks, batch_size)
        _analyze_text(encoder, sample, does_split, json_maps, title, result, figures)
    if positional is not None:
        _analyze_patterns(positional, thresholds, max_offset, zoom, json_maps, title, result, figures)
    _write_analysis(Path(out_dir), result, figures)
    result["files"] = sorted([f"{name}.png" for name in figures] + ["analysis.json", "analysis.html"])
    return result


@dataclass(frozen=True)
class _Sample:
    """The text blocks `analyze` reads: from `text`, under `tokenizer` (default: the model's), `num_blocks` of
    `n` tokens, run `batch_size` at a time."""

    text: str | Path
    tokenizer: str | Path | None
    model_dir: str | Path
    n: int
    num_blocks: int
    batch_size: int


def _analyze_text(
    encoder: Any, sample: _Sample, does_split: bool, json_maps: bool, title: str, result: dict, figures: dict
) -> None:
    """The text's blocks and, for a scheme whose input positions split, the word/position decomposition of the
    first layer's logits (paper Fig. 2), into `result` and `figures`."""
    from tupe.io.checkpoints import load_tokenizer
    from tupe.modeling.positional import scheme_class

    from .decomposition import TERMS, decompose
    from .figures import decomposition_figure
    from .loading import read_text_sample, text_blocks

    config, text, n = encoder.config, sample.text, sample.n
    tok = load_tokenizer(sample.tokenizer or sample.model_dir, explicit=sample.tokenizer is not None)
    raw = read_text_sample(text, max_chars=max(200_000, sample.num_blocks * n * 12))
    blocks = text_blocks(raw, tok, n, sample.num_blocks, source=str(text))
    if int(blocks.max()) >= config.vocab_size:
        raise TupeError(
            f"tokenizer gives id {int(blocks.max())} but the model's vocab_size is "
            f"{config.vocab_size}: the tokenizer does not belong to this model"
        )
    result["text"] = str(text)
    result["num_blocks"] = int(blocks.shape[0])
    if not does_split:
        return
    dec = decompose(encoder, blocks, batch_size=sample.batch_size)
    result["decomposition"] = {
        "convention": "LayerNorm split with per-token statistics of w+p; LayerNorm bias, query/key "
        "biases"
        + (" and relative bias" if scheme_class(config.position_scheme).report.relative_bias else "")
        + " on the position side",
        "max_abs_error": dec.max_abs_error,
        "stats": dec.stats,
    }
    if json_maps:
        result["decomposition"]["mean_maps"] = {name: _round(dec.mean[name]) for name in (*TERMS, "total")}
    figures["decomposition"] = decomposition_figure(dec, title)


def _analyze_patterns(
    positional: Any,
    thresholds: PatternThresholds,
    max_offset: int,
    zoom: int,
    json_maps: bool,
    title: str,
    result: dict,
    figures: dict,
) -> None:
    """The content-free attention of every head (paper Fig. 6): labels, offset profile, figures."""
    import torch

    from .figures import offset_profile_figure, pattern_grid_figure
    from .patterns import head_patterns, offset_profile

    pats = head_patterns(positional, thresholds)
    probs = torch.softmax(positional.double(), dim=-1).float()
    offsets, profile = offset_profile(positional, max_offset)
    result["patterns"] = {
        "thresholds": asdict(thresholds),
        "heads": [p.as_dict() for p in pats],
        "label_counts": dict(Counter(p.label for p in pats)),
        "offsets": offsets,
        "offset_profile": _round(profile),
    }
    if json_maps:
        result["patterns"]["positional_logits"] = _round(positional.detach().float(), 4)
    figures["patterns"] = pattern_grid_figure(probs, pats, title)
    figures["patterns_zoom"] = pattern_grid_figure(probs, pats, title, zoom=zoom)
    figures["offset_profile"] = offset_profile_figure(offsets, profile, pats, title)


def _write_analysis(out: Path, result: dict, figures: dict[str, bytes]) -> None:
    """The figures, analysis.json and analysis.html, claimed first and written all or nothing: a kill or a full
    disk leaves the previous analysis (or none), never a mix."""
    from tupe.io.files import atomic_write_files

    from .report import render_html

    had_record = os.path.lexists(out / RECORD_NAME)
    OutputFolder(out, "tupe analyze").claim(
        *(f"{name}.png" for name in figures), "analysis.json", "analysis.html"
    )
    files = {f"{name}.png": png for name, png in figures.items()}
    files["analysis.json"] = json.dumps(result, indent=1).encode()
    files["analysis.html"] = render_html(result, figures).encode()
    new = [n for n in files if not os.path.lexists(out / n)]
    try:
        atomic_write_files(out, files)
    except TupeError:
        update_record(out, drop=new)  # the files that were claimed but never written are no longer tupe's
        if not had_record and not (read_record(out) or {}):
            (out / RECORD_NAME).unlink(missing_ok=True)  # a record of nothing, made by this call
        raise


ANALYSIS_FILES = (
    "analysis.json",
    "analysis.html",
    "decomposition.png",
    "patterns.png",
    "patterns_zoom.png",
    "offset_profile.png",
)


def run(args: argparse.Namespace) -> int:
    from tupe.io.files import failed_writes_reported, folder_lock

    V.check_path_kind("--model", args.model, "folder")
    V.check_out_folder("--out", args.out)
    if args.text is not None:
        V.check_path_kind("--text", args.text, "any")
    from tupe.runtime import hushed_libraries

    if args.tokenizer is not None:
        V.check_path_kind("--tokenizer", args.tokenizer, "folder")
    V.apply_threads(args.threads)
    # a user's (or another command's) file where the analysis goes stops it before any work
    OutputFolder(args.out, "tupe analyze").check(*ANALYSIS_FILES)
    with folder_lock(args.out, "tupe analyze"), hushed_libraries(progress=args.progress):
        with failed_writes_reported(args.out, "rerun after freeing space (the figures are rewritten)"):
            result = _analyze_from_args(args)
    _print_result(result, args.out)
    return 0


def _analyze_from_args(args: argparse.Namespace) -> dict:
    return analyze(
        args.model,
        args.out,
        text=args.text,
        tokenizer=args.tokenizer,
        max_length=args.max_length,
        num_blocks=args.num_blocks,
        batch_size=args.batch_size,
        zoom=args.zoom,
        max_offset=args.max_offset,
        title=args.title,
        json_maps=not args.no_json_maps,
    )


def _print_result(result: dict, out: str) -> None:
    from .decomposition import TERMS

    print(f"{result['title']} ({result['position_scheme']}): wrote {', '.join(result['files'])} to {out}")
    if "decomposition" in result:
        st = result["decomposition"]["stats"]
        print("first-layer term  row std (text mean, per head)  share of total  row std (single inputs)")
        for name in (*TERMS, "total"):
            print(
                f"  {name:<10} {st[name]['row_std_per_head']:>20.4f} {st[name]['relative_row_std']:>23.3f}"
                f" {st[name]['row_std_per_example']:>24.4f}"
            )
        print(f"  four terms sum to the logits within {result['decomposition']['max_abs_error']:.1e}")
    if "patterns" in result:
        print("head  label     E[j-i]  entropy  +-2 mass  prev   next   to[CLS]")
        for h in result["patterns"]["heads"]:
            print(
                f"  {h['head']:>2}  {h['label']:<8} {h['expected_offset']:>7.2f} {h['entropy']:>8.3f} "
                f"{h['local_mass']:>9.3f} {h['previous_mass']:>6.3f} {h['next_mass']:>6.3f} {h['to_cls']:>8.3f}"
            )
