"""Model cards: the `README.md` written next to every saved model and every GLUE result folder, as the Hub and
`transformers` users expect (YAML front matter, then what the model is, how it was made, how well it does and
how to load it)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from tupe.io.files import atomic_write_text

PAPER = (
    'Guolin Ke, Di He, Tie-Yan Liu, "Rethinking Positional Encoding in Language Pre-training", ICLR 2021 '
    "(arXiv:2006.15595)"
)
CARD_NAME = "README.md"
# the card's kind (its pipeline tag) -> the transformers Auto class that loads the folder
AUTO_CLASSES = {
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
}


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a user would type it (`tupe pretrain ...`)."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "tupe"
    if prog in ("__main__.py", "-m", "cli.py") or prog.startswith("python"):
        prog = "tupe"
    return " ".join(shlex.quote(a) for a in [prog, *argv[1:]])


def scheme_description(scheme: str) -> tuple[str, str]:
    """(display name, one-line equation summary) of a positional scheme, from its class in `positional.py`."""
    from tupe.modeling.positional import SCHEMES

    cls = SCHEMES.get(scheme)
    if cls is None:
        return scheme, ""
    doc = (cls.__doc__ or "").strip().split("\n")[0]
    return cls.report.display_name, doc


def base_model_name(path: str | os.PathLike) -> str:
    """How a card names the pre-trained model it was fine-tuned from (its `base_model`): the folder's name, which
    is the repository's name once both are on the Hub; never a local path, which means nothing elsewhere."""
    return Path(path).resolve().name


def framework_versions() -> dict[str, str]:
    """The installed versions of what trains and loads a model (a card's "Framework versions")."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name, package in (
        ("tupe", "tupe"),
        ("Transformers", "transformers"),
        ("PyTorch", "torch"),
        ("Tokenizers", "tokenizers"),
        ("Datasets", "datasets"),
    ):
        try:
            out[name] = version(package)
        except PackageNotFoundError:
            continue
    return out


def front_matter(
    kind: str,
    scheme: str,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    model_index: dict[str, Any] | None = None,
) -> str:
    """The card's YAML metadata, as the Hub reads it (`huggingface_hub.ModelCardData`): library, pipeline tag,
    `base_model`, `datasets`, tags and, with `model_index` ({"name", "dataset": {"name", "type", "split"},
    "metrics": {metric: value}}), the `model-index` of its results."""
    from huggingface_hub import EvalResult, ModelCardData
    from huggingface_hub.utils import yaml_dump

    results = None
    if model_index:
        dataset = model_index["dataset"]
        results = [
            EvalResult(
                task_type=kind,
                dataset_type=dataset["type"],
                dataset_name=dataset["name"],
                dataset_split=dataset.get("split"),
                metric_type=metric,
                metric_name=metric,
                metric_value=value,
            )
            for metric, value in model_index["metrics"].items()
            if isinstance(value, int | float) and value == value  # an undefined score (None, NaN): no entry
        ] or None
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=kind,
        base_model=base_model,
        datasets=datasets or None,
        tags=["tupe", scheme, "positional-encoding"],
        model_name=model_index["name"] if results else None,
        eval_results=results,
    ).to_dict()
    order = ("library_name", "pipeline_tag", "base_model", "datasets", "tags")
    ordered = {k: data[k] for k in order if k in data} | {k: v for k, v in data.items() if k not in order}
    return "---\n" + yaml_dump(ordered, sort_keys=False) + "---"


def _table(rows: dict[str, Any]) -> str:
    lines = ["| | |", "|---|---|"]
    for k, v in rows.items():
        if v is None:
            continue
        if isinstance(v, float):
            v = f"{v:.6g}"
        lines.append(f"| {k} | {v} |")
    return "\n".join(lines)


def model_card(
    *,
    kind: str,
    scheme: str,
    recipe: dict[str, Any],
    data: str,
    metrics: dict[str, Any],
    command: str | None = None,
    model_path: str = "PATH",
    notes: str = "",
    mask_token: str = "[MASK]",
    aggregation_strategy: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    model_index: dict[str, Any] | None = None,
) -> str:
    """The card's Markdown. `kind`: "fill-mask" (a pre-trained model), "text-classification" (GLUE, `tupe
    finetune --task classification`), "token-classification" (`--task ner`; `aggregation_strategy`: the
    pipeline's that matches how the labels were trained, saved in config.json), "question-answering" or
    "multiple-choice". `base_model`, `datasets` and `model_index` go into the YAML metadata (`front_matter`);
    `recipe` is the table of training hyper-parameters."""
    name, equation = scheme_description(scheme)
    command = command or command_line()
    auto = AUTO_CLASSES.get(kind, "AutoModelForSequenceClassification")
    what = _WHAT.get(kind, "fine-tuned classifier")
    front = front_matter(kind, scheme, base_model, datasets, model_index)
    versions = "\n".join(f"- {name} {v}" for name, v in framework_versions().items())
    parts = [
        front,
        f"# {name} ({scheme}) — {what}",
        f'Positional scheme **{name}** (`position_scheme="{scheme}"`): {equation}'.rstrip(": ")
        + "\n\nFrom the TUPE paper: "
        + PAPER
        + ". The maths of every scheme is in `docs/model.md` of the `tupe` package.",
        "## Training hyperparameters\n\n" + _table(recipe),
        "## Data\n\n" + data,
        "## Results\n\n" + (_table(metrics) if metrics else "(none recorded)"),
        "## How it was made\n\n```bash\n" + command + "\n```\n\nFramework versions:\n\n" + versions,
        _how_to_load(kind, auto, model_path, _usage(kind, model_path, mask_token), aggregation_strategy),
    ]
    if notes:
        parts.append(notes)
    return "\n\n".join(parts) + "\n"


_WHAT = {
    "fill-mask": "masked-LM encoder",
    "token-classification": "fine-tuned token classifier (NER)",
    "question-answering": "fine-tuned extractive question answering",
    "multiple-choice": "fine-tuned multiple choice",
}


def _usage(kind: str, model_path: str, mask_token: str) -> str:
    """The card's example call of the model, by kind."""
    pipe = f'model="{model_path}", trust_remote_code=True'
    if kind == "fill-mask":
        return (
            f'fill = pipeline("fill-mask", {pipe})\n'
            f'print(fill("The man {mask_token} the door.", tokenizer_kwargs={{"truncation": True}}))'
        )
    if kind == "token-classification":
        # no aggregation_strategy: the pipeline reads the one config.json names (the folder's pipeline code)
        return (
            f'ner = pipeline("token-classification", {pipe})\n'
            'print(ner("Alice Smith flew from Paris to Berlin."))'
        )
    if kind == "question-answering":
        return (
            "import tupe  # registers the question-answering pipeline (transformers 5 has none of its own)\n\n"
            f'qa = pipeline("question-answering", model="{model_path}")\n'
            'print(qa(question="Where did Alice fly?", context="Alice flew from Paris to Berlin."))'
        )
    if kind == "multiple-choice":
        return (
            "import torch\n\n"
            'first, endings = "She opened the door.", ["She walked in.", "The door ate lunch."]\n'
            'enc = tokenizer([first] * len(endings), endings, return_tensors="pt", padding=True)\n'
            "print(model(**{k: v.unsqueeze(0) for k, v in enc.items()}).logits.argmax(-1))"
        )
    return (
        f'classify = pipeline("text-classification", {pipe})\n'
        'print(classify("A sentence to classify.", truncation=True))'
    )


def _how_to_load(kind: str, auto: str, model_path: str, use: str, aggregation_strategy: str | None) -> str:
    """The card's "How to load" section."""
    return (
        "## How to load\n\n"
        "The folder holds the modeling code (`auto_map`), so `transformers` loads it without `tupe` installed:\n\n"
        "```python\n"
        f"from transformers import {auto}, AutoTokenizer, pipeline\n\n"
        f'model = {auto}.from_pretrained("{model_path}", trust_remote_code=True)\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{model_path}", trust_remote_code=True)\n'
        f"{use}\n"
        "```\n\n"
        "`AutoTokenizer` reads config.json, whose `auto_map` names the folder's code: without `tupe`, "
        "`trust_remote_code=True` is needed there too (else transformers asks whether to run it); the tokenizer "
        "itself is transformers' own fast tokenizer (`tokenizer.json`). "
        + (
            "The folder's code also serves `pipeline(\"token-classification\")` with tupe's: whole words "
            "(punctuation apart) at exact spans, read with the `aggregation_strategy` that config.json names"
            + (f' (`"{aggregation_strategy}"`)' if aggregation_strategy else "")
            + ", the entities `tupe` gives. "
            if kind == "token-classification"
            else ""
        )
        + "With `tupe` installed, `import tupe` registers the classes and `trust_remote_code` is not needed. "
        "The tokenizer knows the model's maximum length: pass `truncation=True` for longer texts."
    )


def write_model_card(folder: str | os.PathLike, **kwargs: Any) -> Path:
    """Write `folder/README.md` (atomically); returns its path."""
    path = Path(folder) / CARD_NAME
    atomic_write_text(path, model_card(model_path=str(folder), **kwargs))
    return path
