"""Shared test helpers."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch on `n` threads inside the block, the caller's count restored after (tiny models: more threads only add
    synchronisation, and are slow on a shared machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_test_tokenizer(lines: list[str], vocab_size: int):  # noqa: ANN201 - a PreTrainedTokenizerFast
    """A tiny byte-level BPE made by the project's own trainer, so fixtures follow the real tokenizer contract."""
    from tupe.data.corpus import Corpus
    from tupe.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return train_tokenizer(
            Corpus(files=[path]), vocab_size=vocab_size, min_frequency=1, show_progress=False
        )


# A tiny model with every dropout off, small enough for the float64 naive oracle; `**overrides` change any value.
TINY_MODEL = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=40,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    position_buckets=8,  # deberta: log buckets from |i - j| > 4 on, clipped beyond 15
    max_relative_positions=16,
)


def tiny_config(scheme: str, **overrides):  # noqa: ANN201 - a TupeConfig
    from tupe import TupeConfig
    from tupe.modeling.positional import SCHEMES, scheme_fields

    # TINY_MODEL's values of other schemes' fields are left out (a config warns of a setting its scheme ignores)
    others = set(scheme_fields()) - {field.name for field in SCHEMES[scheme].config_fields}
    base = {k: v for k, v in TINY_MODEL.items() if k not in others}
    return TupeConfig(**{**base, "position_scheme": scheme, **overrides})


def random_bert(class_name: str = "BertForMaskedLM", **overrides):  # noqa: ANN201 - a transformers BERT model
    """A small transformers BERT model of `class_name`, dropout off, with non-trivial values everywhere
    (token-type embedding and biases included), as the oracle of the `from_bert` conversions."""
    import torch
    import transformers

    config = transformers.BertConfig(
        **{
            "vocab_size": 60,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 48,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            **overrides,
        }
    )
    torch.manual_seed(1)
    bert = getattr(transformers, class_name)(config).eval()
    with torch.no_grad():
        for p in bert.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return bert


def hold_lock(kind: str, path: Path, command: str, argv: list | None = None):  # noqa: ANN201 - a subprocess.Popen
    """Start a process that holds `tupe.io.files.folder_lock` or `file_lock` (`kind`) on `path` until killed, as
    `tupe ARGV` would (the command line its lock info shows); returned once the lock is held. The caller kills it
    (SIGKILL leaves a lock file that a dead process held)."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = (
        f"import json,sys,time; from tupe.io.files import {kind}\n"
        "path, command = sys.argv[1], sys.argv[2]; sys.argv = ['tupe', *json.loads(sys.argv[3])]\n"
        f"with {kind}(path, command):\n print('locked', flush=True); time.sleep(120)\n"
    )
    shown = json.dumps([str(a) for a in argv] if argv else [])
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path), command, shown], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def load_script(relative: str):  # noqa: ANN201 - the script as a module
    """A script of the repository that is not in a package (scripts/results/..., benchmarks/...) as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def google_bert_folder(folder: Path, words: Sequence[str] = (), class_name: str = "BertForMaskedLM") -> Path:
    """A small transformers BERT saved with `save_pretrained` beside a WordPiece tokenizer in Google's vocabulary
    layout (bert-base-uncased's): [PAD] 0, [unused0..98], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then
    `words` and every letter, digit and punctuation mark alone and as a `##` continuation (so any ASCII text
    tokenizes without [UNK]). Built with transformers alone, independently of tupe's tokenizer code."""
    import string

    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [*sorted({w.lower() for w in words} - set(chars)), *chars, *(f"##{c}" for c in chars)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # from vocab.txt, as a Hub folder has it
    tok = transformers.BertTokenizerFast.from_pretrained(str(folder))
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0, 100, 101, 102, 103,
    )  # fmt: skip
    tok.save_pretrained(folder)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128, pad_token_id=0,
    )  # fmt: skip
    getattr(transformers, class_name)(config).save_pretrained(folder)
    return folder


def run_card_without_tupe(card: Path, after: str, workdir: Path):  # noqa: ANN201 - a subprocess.CompletedProcess
    """Run the Python recipe of a model card ("How to load") as a user without tupe would: in a fresh process
    where `import tupe` fails, tupe's folders are not on sys.path, stdin is closed (a prompt would fail, not
    wait) and transformers keeps the folder's code in `workdir`; then `after` (code reading the recipe's
    variables). Returns the finished process (stdout, stderr)."""
    import os
    import re
    import subprocess
    import sys
    import textwrap

    text = Path(card).read_text(encoding="utf-8").split("## How to load", 1)[1]
    (recipe,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    root = str(Path(__file__).resolve().parents[1])
    script = (
        "import sys\n"
        f"sys.path = [p for p in sys.path if p not in ('', {root!r})]\n"
        'sys.modules["tupe"] = None  # no tupe: only the folder\'s own code may be used\n'
        + recipe
        + "\n"
        + textwrap.dedent(after)
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(workdir / "modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=workdir,
        env=env,
        timeout=600,
    )
