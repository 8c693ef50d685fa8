"""Small GLUE-format fixtures written by the tests themselves, one per task layout, with GLUE's quirks
(MRPC's byte-order mark, stray quote characters, CoLA without a header, MNLI's two dev files), and a tiny
checkpoint (TupeForMaskedLM + a byte-level BPE tokenizer following the project's tokenizer contract)."""

from __future__ import annotations

import random
from pathlib import Path

GOOD = ["good", "great", "fine", "lovely", "happy", "warm"]
BAD = ["bad", "awful", "poor", "sad", "cold", "grim"]
NOUNS = ["film", "book", "day", "song", "meal", "town", "cat", "dog"]
VERBS = ["is", "was", "seems", "looked", "felt"]


def _sentence(rng: random.Random, words: list[str]) -> str:
    s = f"the {rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.choice(words)}"
    r = rng.random()
    if r < 0.15:
        s = f'he said "{s}'  # a stray, unbalanced quote, as in real GLUE files
    elif r < 0.25:
        s = f"{s} ' n"
    return s + " ."


def _pair(rng: random.Random, same: bool) -> tuple[str, str]:
    a_words = GOOD if rng.random() < 0.5 else BAD
    b_words = a_words if same else (BAD if a_words is GOOD else GOOD)
    return _sentence(rng, a_words), _sentence(rng, b_words)


def _write(path: Path, lines: list[str], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


def write_task(root: Path, task: str, n_train: int = 48, n_dev: int = 24, seed: int = 0) -> Path:
    """Write `root/TASK/train.tsv` and its dev file(s) in the task's GLUE layout; returns the task folder."""
    rng = random.Random(seed)
    d = root / task
    splits = {"train": n_train, "dev": n_dev}
    if task == "MNLI":
        splits = {"train": n_train, "dev_matched": n_dev, "dev_mismatched": n_dev}
    for split, n in splits.items():
        rows: list[str] = []
        for i in range(n):
            y = i % 2 if task != "MNLI" else i % 3
            if task == "CoLA":
                s = _sentence(rng, GOOD)
                s = s if y else " ".join(reversed(s.split()))
                rows.append(f"gj04\t{y}\t{'' if y else '*'}\t{s}")
            elif task == "SST-2":
                rows.append(f"{_sentence(rng, GOOD if y else BAD)} \t{y}")
            elif task == "MRPC":
                a, b = _pair(rng, bool(y))
                rows.append(f"{y}\t{1000 + i}\t{2000 + i}\t{a}\t{b}")
            elif task == "STS-B":
                a, b = _pair(rng, rng.random() < 0.5)
                score = round(rng.uniform(0, 5), 3)
                rows.append(f"{i}\tmain-news\t2012\t{2012 + i % 3}\t{i:04d}\tnone\tnone\t{a}\t{b}\t{score}")
            elif task == "QQP":
                a, b = _pair(rng, bool(y))
                rows.append(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}?\t{b}?\t{y}")
            elif task == "MNLI":
                label = ["entailment", "neutral", "contradiction"][y]
                a, b = _pair(rng, y == 0)
                parses = "\t".join([f"( {a} )", f"( {b} )", f"(ROOT {a})", f"(ROOT {b})"])
                extra = f"{label}\t{label}\t{label}\t{label}\t" if split != "train" else ""
                rows.append(
                    f"{i}\t{31193 + i}\t{31193 + i}n\tfiction\t{parses}\t{a}\t{b}\t{label}\t{extra}{label}"
                )
            elif task == "QNLI":
                a, b = _pair(rng, y == 0)
                rows.append(f"{i}\twhat {a}?\t{b}\t{['entailment', 'not_entailment'][y]}")
            elif task == "RTE":
                a, b = _pair(rng, y == 0)
                rows.append(f"{i}\t{a}\t{b}\t{['entailment', 'not_entailment'][y]}")
            elif task == "WNLI":
                a, b = _pair(rng, bool(y))
                rows.append(f"{i}\t{a}\t{b}\t{y}")
            else:
                raise ValueError(task)
        header = {
            "CoLA": None,
            "SST-2": "sentence\tlabel",
            "MRPC": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
            "QQP": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            "MNLI": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\t"
            + ("label2\tlabel3\tlabel4\tlabel5\t" if split != "train" else "")
            + "gold_label",
            "QNLI": "index\tquestion\tsentence\tlabel",
            "RTE": "index\tsentence1\tsentence2\tlabel",
            "WNLI": "index\tsentence1\tsentence2\tlabel",
        }[task]
        _write(d / f"{split}.tsv", ([header] if header else []) + rows, bom=task == "MRPC")
    return d


ALL_TASKS = ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]


def corpus_lines() -> list[str]:
    rng = random.Random(1)
    lines = [_sentence(rng, GOOD + BAD) for _ in range(300)]
    lines += [" ".join(GOOD + BAD + NOUNS + VERBS), "what is the ? he said \" ' n ."]
    return lines


def make_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer following the project's contract ([PAD]=0 [CLS]=1 [SEP]=2 [MASK]=3 [UNK]=4)."""
    from ..helpers import train_test_tokenizer

    return train_test_tokenizer(corpus_lines(), vocab_size)


def make_checkpoint(path: Path, scheme: str = "tupe-a", max_positions: int = 64) -> Path:
    """A tiny TupeForMaskedLM saved with save_pretrained, with its tokenizer, in `path`."""
    import torch

    from tupe import TupeConfig, TupeForMaskedLM

    tok = make_tokenizer()
    torch.manual_seed(0)
    config = TupeConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        position_scheme=scheme,
        hidden_dropout_prob=0.0,  # like the `mini` pre-training preset: fine-tuning must still use 0.1
        attention_probs_dropout_prob=0.0,
    )
    TupeForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
