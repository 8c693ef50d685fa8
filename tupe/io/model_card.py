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
    return cls.display_name, doc


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
    aggregation_strategy: str = "first",
) -> str:
    """The card's Markdown. `kind`: "fill-mask" (a pre-trained model), "text-classification" (GLUE, `tupe
    finetune --task classification`), "token-classification" (`--task ner`; `aggregation_strategy`: the
    pipeline's that matches how the labels were trained), "question-answering" or "multiple-choice"."""
    name, equation = scheme_description(scheme)
    command = command or command_line()
    auto = AUTO_CLASSES.get(kind, "AutoModelForSequenceClassification")
    pipe = f'model="{model_path}", trust_remote_code=True'
    if kind == "fill-mask":
        use = (
            f'fill = pipeline("fill-mask", {pipe})\n'
            f'print(fill("The man {mask_token} the door.", tokenizer_kwargs={{"truncation": True}}))'
        )
    elif kind == "token-classification":
        use = (
            f'ner = pipeline("token-classification", {pipe}, aggregation_strategy="{aggregation_strategy}")\n'
            'print(ner("Alice Smith flew from Paris to Berlin."))'
        )
    elif kind == "question-answering":
        use = (
            "import tupe  # registers the question-answering pipeline (transformers 5 has none of its own)\n\n"
            f'qa = pipeline("question-answering", model="{model_path}")\n'
            'print(qa(question="Where did Alice fly?", context="Alice flew from Paris to Berlin."))'
        )
    elif kind == "multiple-choice":
        use = (
            "import torch\n\n"
            'first, endings = "She opened the door.", ["She walked in.", "The door ate lunch."]\n'
            'enc = tokenizer([first] * len(endings), endings, return_tensors="pt", padding=True)\n'
            "print(model(**{k: v.unsqueeze(0) for k, v in enc.items()}).logits.argmax(-1))"
        )
    else:
        use = (
            f'classify = pipeline("text-classification", {pipe})\n'
            'print(classify("A sentence to classify.", truncation=True))'
        )
    what = {
        "fill-mask": "masked-LM encoder",
        "token-classification": "fine-tuned token classifier (NER)",
        "question-answering": "fine-tuned extractive question answering",
        "multiple-choice": "fine-tuned multiple choice",
    }.get(kind, "fine-tuned classifier")
    front = "\n".join(
        [
            "---",
            "library_name: transformers",
            f"pipeline_tag: {kind}",
            "tags:",
            "- tupe",
            f"- {scheme}",
            "- positional-encoding",
            "---",
        ]
    )
    parts = [
        front,
        f"# {name} ({scheme}) — {what}",
        f'Positional scheme **{name}** (`position_scheme="{scheme}"`): {equation}'.rstrip(": ")
        + "\n\nFrom the TUPE paper: "
        + PAPER
        + ". The maths of every scheme is in `docs/model.md` of the `tupe` package.",
        "## Recipe\n\n" + _table(recipe),
        "## Data\n\n" + data,
        "## Results\n\n" + (_table(metrics) if metrics else "(none recorded)"),
        "## How it was made\n\n```bash\n" + command + "\n```",
        "## How to load\n\n"
        "The folder holds the modeling code (`auto_map`), so `transformers` loads it without `tupe` installed:\n\n"
        "```python\n"
        f"from transformers import {auto}, AutoTokenizer, pipeline\n\n"
        f'model = {auto}.from_pretrained("{model_path}", trust_remote_code=True)\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{model_path}")\n'
        f"{use}\n"
        "```\n\n"
        "With `tupe` installed, `import tupe` registers the classes and `trust_remote_code` is not needed. "
        "The tokenizer knows the model's maximum length: pass `truncation=True` for longer texts.",
    ]
    if notes:
        parts.append(notes)
    return "\n\n".join(parts) + "\n"


def write_model_card(folder: str | os.PathLike, **kwargs: Any) -> Path:
    """Write `folder/README.md` (atomically); returns its path."""
    path = Path(folder) / CARD_NAME
    atomic_write_text(path, model_card(model_path=str(folder), **kwargs))
    return path
