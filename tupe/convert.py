"""Convert a checkpoint of another code base into a tupe model folder.

`tupe convert fairseq CHECKPOINT --dict DICT --bpe-codes CODES --out DIR`: a checkpoint of the authors' released
TUPE code (fairseq format, e.g. the TUPE-R checkpoint of github.com/guolinke/TUPE) becomes a folder that
`AutoModelForMaskedLM`, `AutoTokenizer`, `tupe glue`, `tupe evaluate` and `tupe analyze` read. Its pickle is
loaded without running code. See docs/released-checkpoint.md.
"""

from __future__ import annotations

import argparse


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
    from tupe.modeling.fairseq import convert_fairseq_checkpoint

    convert_fairseq_checkpoint(
        args.checkpoint, args.dict_txt, args.bpe_codes, args.out, lowercase=args.lowercase
    )
    return 0
