"""The options of `tupe pretrain`, `compare` and `demo`: the command-line flags, read into a `PretrainConfig`
(`config_from_args`; the configuration and its parts are tupe/training/config.py).

Importing this module imports neither torch nor transformers: `tupe pretrain --help` builds its parser from here
(tupe/cli.py `PARSERS`) and stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tupe import validators as V
from tupe.data.config import PACKINGS
from tupe.training.config import (  # noqa: F401  (re-exported: the configuration's earlier home)
    DataConfig,
    ModelConfig,
    OptimConfig,
    PretrainConfig,
    ResolvedConfig,
    RunConfig,
)
from tupe.training.flags import add_training_flags
from tupe.training.optimizers import OPTIMIZERS
from tupe.training.presets import PRESETS, get_preset
from tupe.training.reporting import add_hub_arguments, add_report_arguments


def pretrain_training_arguments(run: ResolvedConfig):  # noqa: ANN201
    """The Trainer's arguments for a run (`ResolvedConfig.training_arguments`). Creating them also sets up
    torch.distributed under torchrun."""
    return run.training_arguments()


def attention_kernel_name(value: str) -> str:
    """`--attention-kernel`: any value of `attn_implementation` (tupe.modeling.attention_interface), as the
    registry name of its kernel or "auto" (checked when given: it imports the model package)."""
    from tupe.modeling.attention_interface import requested_kernel

    try:
        return requested_kernel(value, "--attention-kernel")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_model_data_arguments(
    p: argparse.ArgumentParser, quiet_help: str = "print nothing but errors"
) -> None:
    """Arguments shared by `pretrain` and `compare` (everything except --scheme/--out), in four groups."""
    _add_data_arguments(p.add_argument_group("data"))
    _add_model_arguments(p.add_argument_group("model"))
    _add_optimisation_arguments(p.add_argument_group("optimisation"))
    _add_logging_arguments(p.add_argument_group("evaluation, checkpoints, logging"), quiet_help)
    V.annotate_ranges(p)


def _add_data_arguments(g: Any) -> None:
    g.add_argument(
        "--corpus",
        nargs="+",
        metavar="PATH",
        help="text files, folders, globs (.gz too), parquet/JSON/JSONL files, a folder saved by `datasets`, or a "
        "`datasets` name NAME[:CONFIG] from the local cache (never downloaded); default: the built-in corpus",
    )
    g.add_argument(
        "--text-column",
        default="text",
        help="column holding the text in parquet/JSON files and `datasets` corpora (default: text)",
    )
    g.add_argument(
        "--skip-bad-text",
        action="store_true",
        help="drop corpus lines that are not UTF-8 and rows whose text is not a string (one warning per file) "
        "instead of stopping",
    )
    g.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="use this tokenizer (folder or tokenizer.json) instead of training a BPE",
    )
    g.add_argument(
        "--vocab-size",
        type=V.int_range(8, V.MAX_VOCAB),
        help=f"BPE vocabulary size to train ({_preset_values('vocab_size')})",
    )
    g.add_argument(
        "--tokenizer-max-mb", type=V.positive_float, help="train the BPE on the first N MB of text only"
    )
    add_training_flags(
        g,
        ["max_seq_len"],
        dests={"max_seq_len": "max_length"},
        helps={"max_seq_len": f"the block length, [CLS] included; {_preset_values('max_length')}"},
    )
    g.add_argument(
        "--valid-every",
        type=V.int_range(2),
        help=f"1 block in N is validation ({_preset_values('valid_every')})",
    )
    add_packing_argument(g)
    g.add_argument("--mlm-probability", type=V.open_prob, help="fraction of tokens to predict (default 0.15)")
    g.add_argument(
        "--cache-dir",
        help="where tokenizers and packed data are cached (default $TUPE_CACHE or ~/.cache/tupe)",
    )


def add_packing_argument(g: Any) -> None:
    """`--packing` (`tupe pretrain`, `compare`, `demo`)."""
    g.add_argument(
        "--packing",
        choices=PACKINGS,
        default="stream",
        help="how documents become blocks (a document ends at a blank line or the end of a file, or is one row of "
        "a table: a file of one text per line without blank lines is one document): stream (default; RoBERTa's "
        "FULL-SENTENCES: one [CLS], then the "
        "documents run on, each ended by [SEP]) or documents (each document from its own [CLS] at position 0, "
        "attention kept inside it, short ones packed together by best fit, long ones cut into pieces; the "
        "batches carry position_ids; docs/pretraining.md). Part of the run: --resume refuses a change",
    )


def _preset_values(key: str) -> str:
    """The default of a setting as `--help` says it, read from the presets: `default 0.9` where every preset has
    the same value, else `preset: 128 mini/small, 512 base/paper`."""
    groups: dict[str, list[str]] = {}
    for name in PRESETS:
        value = get_preset(name)[key]
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}".replace("e-0", "e-")
        groups.setdefault(shown, []).append(name)
    if len(groups) == 1:
        return f"default {next(iter(groups))}"
    return "preset: " + ", ".join(f"{value} {'/'.join(names)}" for value, names in groups.items())


def _add_model_arguments(m: Any) -> None:
    m.add_argument(
        "--preset", default="mini", choices=sorted(PRESETS), help="size and budget (default: mini)"
    )
    m.add_argument("--hidden-size", type=V.int_range(1, V.MAX_WIDTH))
    m.add_argument("--num-layers", dest="num_hidden_layers", type=V.int_range(1, V.MAX_LAYERS))
    m.add_argument("--num-heads", dest="num_attention_heads", type=V.int_range(1, V.MAX_WIDTH))
    m.add_argument("--intermediate-size", type=V.int_range(1, 16 * V.MAX_WIDTH))
    m.add_argument("--dropout", type=V.unit_interval)
    m.add_argument(
        "--max-position-embeddings",
        type=V.int_range(2),
        metavar="N",
        help="rows of a learned position table (default: --max-seq-len); more rows than --max-seq-len leaves the "
        "rows beyond it untrained (`tupe evaluate --lengths` says so)",
    )
    m.add_argument(
        "--init-from",
        metavar="PATH",
        help="continue pre-training from a tupe run (its final model) or model folder, a transformers BERT or "
        "DeBERTa-v2 folder: its tokenizer and shape are used, every weight that maps is copied, positional parts "
        "the --scheme adds start fresh (docs/pretraining.md)",
    )
    m.add_argument(
        "--dense-prediction",
        action="store_true",
        help="LM head on every position (default: masked positions only)",
    )
    m.add_argument(
        "--attention-kernel",
        type=attention_kernel_name,
        metavar="NAME",
        help="the model's attn_implementation, saved with it: auto (default: the fastest exact kernel for the "
        "device and mode) or a kernel, tupe_eager, tupe_sdpa, tupe_fold, tupe_fused, tupe_flex (also without the "
        "tupe_ prefix, or as transformers' eager, sdpa, flex_attention; docs/model.md; an unknown name is refused "
        "with the list), refused if it cannot run the scheme; hf-bert takes eager or sdpa",
    )


def _add_optimisation_arguments(o: Any) -> None:
    add_training_flags(o, ["batch_size"], helps={"batch_size": _preset_values("batch_size")})
    o.add_argument(
        "--grad-accum", type=V.positive_int, default=1, help="gradient accumulation steps (default 1)"
    )
    o.add_argument("--max-steps", type=V.int_range(1, V.MAX_STEPS))
    o.add_argument(
        "--optimizer",
        choices=list(OPTIMIZERS),
        help="optimizer (default adamw, the paper's; part of the run: --resume refuses a change)",
    )
    o.add_argument("--lr", dest="learning_rate", type=V.positive_float, help="peak learning rate")
    add_training_flags(
        o,
        ["warmup_steps", "warmup_ratio", "lr_scheduler"],
        helps={
            "warmup_steps": _preset_values("warmup_steps"),
            "warmup_ratio": "instead of --warmup-steps",
            "lr_scheduler": "default linear, the paper's: linear decay to 0",
        },
    )
    o.add_argument("--weight-decay", type=V.nonneg_float)
    o.add_argument(
        "--positional-lr-scale",
        type=V.positive_float,
        default=1.0,
        help="learning rate of the positional parameters (position tables, U^Q/U^K, relative bias, theta) as a "
        "multiple of --lr (default 1)",
    )
    o.add_argument(
        "--positional-weight-decay",
        type=V.nonneg_float,
        help="weight decay of the positional tables (default: --weight-decay, as the released code, which decays "
        "every parameter; 0 exempts them)",
    )
    add_training_flags(
        o,
        ["adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "precision"],
        defaults={"precision": "auto"},
        helps={
            "adam_beta1": _preset_values("adam_beta1"),
            "adam_beta2": _preset_values("adam_beta2"),
            "adam_epsilon": _preset_values("adam_epsilon") + ", the paper's",
            "max_grad_norm": _preset_values("max_grad_norm"),
            "precision": "default auto",
        },
    )
    add_training_flags(o, ["gradient_checkpointing", "torch_compile"])
    o.add_argument("--seed", type=V.seed_int, default=0)


def _add_logging_arguments(r: Any, quiet_help: str) -> None:
    r.add_argument("--eval-steps", type=V.positive_int, help="validate every N steps")
    r.add_argument("--eval-batch-size", type=V.positive_int)
    r.add_argument("--save-steps", type=V.positive_int, help="checkpoint every N steps")
    r.add_argument(
        "--save-at",
        type=V.int_list(1),
        metavar="N,N,...",
        help="also checkpoint at these steps",
    )
    r.add_argument("--save-total-limit", type=V.positive_int, help="keep only the N newest checkpoints")
    r.add_argument("--logging-steps", type=V.positive_int)
    V.add_threads_progress(r)
    r.add_argument("--quiet", action="store_true", help=quiet_help)
    add_report_arguments(r)


class _SchemeHelp(argparse.Action):
    """`--scheme`, whose help lists the registered schemes (`PositionalScheme.summary`), read when help is shown:
    building it imports the model package, which `tupe pretrain --help` must not do before it is asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.pop("help", None)
        super().__init__(option_strings, dest, **kwargs)

    @property
    def help(self) -> str:
        from tupe.modeling.positional import schemes_help

        return (
            f"positional scheme (default tupe-a): {schemes_help()}; or hf-bert: transformers' own "
            "BertForMaskedLM, a control"
        ).replace("%", "%%")

    @help.setter
    def help(self, value: str | None) -> None:  # argparse sets it; the property above is the help
        pass

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:  # noqa: E501
        setattr(namespace, self.dest, values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheme", default="tupe-a", action=_SchemeHelp, metavar="SCHEME")
    p.add_argument(
        "--out",
        required=True,
        type=V.nonempty_path,
        help="output folder (model, tokenizer, checkpoints, metrics.jsonl)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="start again even if --out holds a run")
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="only train/load the tokenizer and tokenize+pack "
        "the corpus into the cache, then stop (prints the throughput)",
    )
    p.add_argument(
        "--skip-nonfinite",
        action="store_true",
        help="skip (and count) batches whose loss is NaN/inf instead of stopping the run",
    )
    add_model_data_arguments(p)
    add_epochs_argument(p)
    add_hub_arguments(
        p,
        push_help="push the final model to the Hugging Face Hub (needs a login; the Trainer's push_to_hub)",
        id_help="Hub repository for --push-to-hub (the Trainer's hub_model_id; default: the --out folder's name)",
    )


def add_epochs_argument(p: argparse.ArgumentParser) -> None:
    """`--epochs`, the run's length counted in passes over the data (`tupe pretrain`, `tupe compare`)."""
    add_training_flags(
        p.add_argument_group("length in epochs"),
        ["epochs"],
        helps={"epochs": "instead of --max-steps: steps = epochs x training blocks / --batch-size"},
    )


def config_from_args(args: argparse.Namespace, **over: Any) -> PretrainConfig:
    names = {f.name for f in dataclasses.fields(PretrainConfig)}
    kw = {k: v for k, v in vars(args).items() if k in names}
    kw.update(over)
    return PretrainConfig(**kw)


add_pretrain_arguments = add_arguments  # tupe/cli.py PARSERS


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """`tupe compare`'s options (tupe/comparison/compare.py)."""
    p.add_argument(
        "--schemes",
        required=True,
        help="comma-separated schemes; the first is the reference, e.g. bert-a,tupe-a",
    )
    p.add_argument(
        "--out", required=True, type=V.nonempty_path, help="output folder (one sub-folder per scheme)"
    )
    p.add_argument(
        "--seeds",
        help="several seeds per scheme, e.g. 0,1,2 or 0-4 (each changes initialisation, data order and masks); "
        "default: --seed alone",
    )
    p.add_argument(
        "--parallel",
        type=V.positive_int,
        default=1,
        help="runs trained at once, each in its own process (default 1; on a small CPU use the number of "
        "cores, with one thread each)",
    )
    p.add_argument("--resume", action="store_true", help="keep finished runs, continue interrupted ones")
    p.add_argument("--overwrite", action="store_true", help="start every run again")
    add_eval_text_argument(p, default=None)
    add_epochs_argument(p)
    # also annotates the ranges in --help
    add_model_data_arguments(p, quiet_help="print the result tables only (no log lines, no progress bars)")
    p.epilog = (
        "Intervals: with one seed, each final loss and paired difference from the first scheme gets a 95% "
        "bootstrap interval over the shared validation blocks and masks; with several seeds, a Student-t interval "
        "over seeds. A warning says when the validation set is too small for the differences: fewer than 100 "
        "validation blocks, or (one seed) a difference whose interval includes 0; --valid-every sets its size."
    )


def add_eval_text_argument(p: argparse.ArgumentParser, default: list[str] | None) -> None:
    """`--eval-text`: after training, `tupe evaluate` of every run on another text."""
    shipped = "the shipped out-of-domain text (Great Astronomers, 1895 popular science)"
    p.add_argument(
        "--eval-text",
        nargs="+",
        metavar="PATH",
        default=default,
        help="after training, evaluate every run on this text as `tupe evaluate` does (loss, paired 95%% interval "
        f"from the first scheme, word-order check; written to eval_text.json): files, folders, globs, or built-in, "
        f"{shipped}" + ("" if default is None else f" (default: {' '.join(default)})"),
    )
    if default is not None:
        p.add_argument(
            "--no-eval-text", dest="eval_text", action="store_const", const=None, help="skip that evaluation"
        )


DEMO_STEPS = 1400  # `tupe demo` in about 8.5 minutes on a quiet 2-core CPU, both runs side by side (README)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """`tupe demo`'s options (tupe/comparison/demo.py)."""
    p.add_argument(
        "--out", default="tupe-demo", type=V.nonempty_path, help="output folder (default: ./tupe-demo)"
    )
    p.add_argument("--schemes", default="bert-a,tupe-a", help="schemes to compare (default: bert-a,tupe-a)")
    p.add_argument(
        "--max-steps", type=V.int_range(1, V.MAX_STEPS), help=f"steps per scheme (default {DEMO_STEPS})"
    )
    p.add_argument(
        "--corpus",
        nargs="+",
        metavar="PATH",
        help="another corpus, as `tupe pretrain --corpus` takes it (default: the built-in one)",
    )
    p.add_argument(
        "--text-column", default="text", help="column of a parquet/JSON/`datasets` corpus (default: text)"
    )
    p.add_argument("--seed", type=V.seed_int, default=0, help="seed of both runs (default 0)")
    add_packing_argument(p)
    p.add_argument(
        "--cache-dir",
        type=V.nonempty_path,
        help="tokenizer/data cache (default $TUPE_CACHE or ~/.cache/tupe)",
    )
    p.add_argument("--overwrite", action="store_true", help="start again instead of reusing runs in --out")
    p.add_argument(
        "--parallel",
        type=V.positive_int,
        default=2,
        help="runs trained at once, one thread each (default 2: both schemes side by side)",
    )
    add_eval_text_argument(p, default=["built-in"])
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    V.annotate_ranges(p)
