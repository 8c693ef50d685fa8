"""The nine GLUE tasks: their file layouts, labels and metrics, and readers that turn them into plain lists.

GLUE's TSV files are not CSV: sentences contain stray `"` characters, so they are read with quoting off (split on
tabs, nothing else), MRPC's files start with a byte-order mark, and CoLA has no header. Every problem in a file is
reported as one `TupeError` naming the file and line, because a silently skipped or misparsed row changes scores.
The same tasks can be read from a `datasets` GLUE copy saved with `save_to_disk` (or from the hub, where it is
reachable); labels get the same ids either way (the `datasets` GLUE ids).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from tupe.errors import TupeError, one_line
from tupe.io.reading import json_type_name, line_ends


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


@dataclass(frozen=True)
class GlueTask:
    """One sentence(-pair) task as data: where its files are, which columns hold the texts and the label, its label
    set (or regression range), its metrics and its `tupe report` columns. A new task is one entry in `TASKS`
    (or `register_task`); every field but the name and text columns has a default (docs/glue.md, "Your own task").
    """

    name: str  # canonical name, as in the GLUE directory layout ("SST-2")
    # header names of sentence A (and B); for a headerless layout (CoLA): column indices as strings
    text_columns: tuple[str, ...]
    label_column: str = "label"
    tsv_labels: tuple[str, ...] = ()  # label strings in the files, in id order; () for a regression task
    regression_range: tuple[float, float] | None = None  # (low, high) of a regression task's scores
    metrics: tuple[str, ...] = (
        "accuracy",
    )  # metric names computed on every dev split (tupe.finetuning.glue.metrics)
    main_metric: str = ""  # used to pick the best learning rate; default: the first of `metrics`
    epochs: int = 3  # the default epoch count (the paper's for GLUE)
    train_file: str = "train.tsv"  # file names in the task folder; .tsv/.csv/.json/.jsonl/.parquet by suffix
    dev_files: dict[str, str] = field(default_factory=lambda: {"dev": "dev.tsv"})
    label_names: tuple[str, ...] = ()  # human-readable names in id order; default: `tsv_labels`
    hf_name: str = ""  # `datasets` config name ("sst2"); default: the name in lower case without "-"/"_"
    hf_text_columns: tuple[str, ...] = ()  # the `datasets` column names; default: `text_columns`
    hf_dev_splits: dict[str, str] = field(default_factory=lambda: {"dev": "validation"})
    header: bool = True
    n_columns: int | None = None  # exact column count where the layout fixes it (CoLA, STS-B, ...)
    aliases: tuple[str, ...] = ()
    # (column, dev split, metric) of `tupe report`; default: one column named after the task, its main metric
    report_columns: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        if bool(self.tsv_labels) == (self.regression_range is not None):
            raise ValueError(f"task {self.name!r}: give either tsv_labels or regression_range")
        if len(self.text_columns) not in (1, 2):
            raise ValueError(f"task {self.name!r}: one or two text columns, got {len(self.text_columns)}")
        if set(self.dev_files) != set(self.hf_dev_splits):
            if self.hf_dev_splits == {"dev": "validation"}:  # the default: one `validation` per dev file
                object.__setattr__(self, "hf_dev_splits", {k: "validation" for k in self.dev_files})
            else:
                raise ValueError(f"task {self.name!r}: dev_files and hf_dev_splits name different splits")
        defaults = {
            "main_metric": self.metrics[0],
            "label_names": self.tsv_labels,
            "hf_name": _norm(self.name),
            "hf_text_columns": self.text_columns,
            "report_columns": ((self.name, next(iter(self.dev_files)), self.main_metric or self.metrics[0]),),
        }
        for key, value in defaults.items():
            if not getattr(self, key):
                object.__setattr__(self, key, value)
        if self.main_metric not in self.metrics:
            raise ValueError(
                f"task {self.name!r}: main_metric {self.main_metric!r} is not one of its metrics"
            )
        self._check_metrics()

    def _check_metrics(self) -> None:
        """A metric the task's labels cannot have is refused when the entry is made, not after a grid's training."""
        from tupe.finetuning.glue.metrics import CLASS_METRICS, METRIC_NAMES

        for metric in self.metrics:
            if metric not in METRIC_NAMES:
                raise ValueError(
                    f"task {self.name!r}: unknown metric {metric!r}; known: {', '.join(METRIC_NAMES)}"
                )
            if (metric in CLASS_METRICS) == (self.regression_range is not None):
                kind = "a regression task" if self.regression_range is not None else "a task with labels"
                raise ValueError(f"task {self.name!r}: {metric} does not apply to {kind}")
            if metric == "f1" and self.tsv_labels != ANY_LABEL and len(self.tsv_labels) != 2:
                raise ValueError(
                    f"task {self.name!r}: f1 is the binary F1 of label 1; with {len(self.tsv_labels)} labels use "
                    "macro_f1"
                )

    @property
    def is_regression(self) -> bool:
        return self.regression_range is not None

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.tsv_labels)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


# `tsv_labels` of a task whose label set is learnt from its training file (`tupe finetune --task
# classification`): the readers then return the label strings as they are
ANY_LABEL = ("*",)
_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

# The paper's Table 1 order (`tupe report` keeps it); WNLI last, as the paper leaves it out.
TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in [
        GlueTask(
            name="MNLI",
            text_columns=("sentence1", "sentence2"),
            label_column="gold_label",
            tsv_labels=("entailment", "neutral", "contradiction"),
            epochs=5,
            dev_files={"dev_matched": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv"},
            hf_text_columns=("premise", "hypothesis"),
            hf_dev_splits={"dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched"},
            report_columns=(("MNLI-m", "dev_matched", "accuracy"), ("MNLI-mm", "dev_mismatched", "accuracy")),
        ),
        GlueTask(
            name="QNLI",
            text_columns=("question", "sentence"),
            tsv_labels=_NLI2,
            epochs=5,
            n_columns=4,
        ),
        GlueTask(
            name="QQP",
            text_columns=("question1", "question2"),
            label_column="is_duplicate",
            tsv_labels=_BINARY,
            label_names=("not_duplicate", "duplicate"),
            metrics=("accuracy", "f1"),
            epochs=5,
            n_columns=6,
        ),
        GlueTask(
            name="SST-2",
            text_columns=("sentence",),
            tsv_labels=_BINARY,
            label_names=("negative", "positive"),
            epochs=10,
            n_columns=2,
            aliases=("SST2", "SST"),
            report_columns=(("SST", "dev", "accuracy"),),
        ),
        GlueTask(
            name="CoLA",
            # no header; columns: source, label, original mark, sentence
            text_columns=("3",),
            label_column="1",
            tsv_labels=_BINARY,
            label_names=("unacceptable", "acceptable"),
            metrics=("mcc",),
            epochs=10,
            hf_text_columns=("sentence",),
            header=False,
            n_columns=4,
        ),
        GlueTask(
            name="MRPC",
            text_columns=("#1 String", "#2 String"),
            label_column="Quality",
            tsv_labels=_BINARY,
            label_names=("not_equivalent", "equivalent"),
            metrics=("accuracy", "f1"),
            epochs=10,
            hf_text_columns=("sentence1", "sentence2"),
            n_columns=5,
        ),
        GlueTask(
            name="RTE",
            text_columns=("sentence1", "sentence2"),
            tsv_labels=_NLI2,
            epochs=10,
            n_columns=4,
        ),
        GlueTask(
            name="STS-B",
            text_columns=("sentence1", "sentence2"),
            label_column="score",
            regression_range=(0.0, 5.0),
            metrics=("pearson", "spearman"),
            epochs=10,
            n_columns=10,
            aliases=("STSB", "STS"),
            report_columns=(("STS", "dev", "pearson"),),
        ),
        GlueTask(
            name="WNLI",
            text_columns=("sentence1", "sentence2"),
            tsv_labels=_BINARY,
            label_names=("not_entailment", "entailment"),
            epochs=10,
            n_columns=4,
        ),
    ]
}


def register_task(task: GlueTask) -> GlueTask:
    """Add a task to the table (from Python), so `load_task`, the fine-tuning grid and `tupe report` know it."""
    if any(_norm(task.name) == _norm(t.name) for t in TASKS.values()):
        raise TupeError(f"a task named {task.name!r} is already in the table")
    TASKS[task.name] = task
    return task


def get_task(name: str) -> GlueTask:
    """Look a task up by any common spelling (`SST-2`, `sst2`, `sts-b`, ...)."""
    for task in TASKS.values():
        if _norm(name) in {_norm(task.name), task.hf_name, *(_norm(a) for a in task.aliases)}:
            return task
    raise TupeError(f"unknown GLUE task {name!r}; choose from {', '.join(TASKS)}")


@dataclass
class Split:
    """One split of a task as plain lists. `labels` are ids (int) or scores (float, STS-B)."""

    source: str  # where it came from (a file path, or a `datasets` split description)
    text_a: list[str]
    text_b: list[str] | None
    labels: list[int] | list[float]
    index: list[int]  # line number in the file (1-based), or the dataset's row index

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, rows: list[int]) -> Split:
        """The rows at the given positions, in that order (for `--max-train-samples`)."""
        return Split(
            source=self.source,
            text_a=[self.text_a[i] for i in rows],
            text_b=None if self.text_b is None else [self.text_b[i] for i in rows],
            labels=[self.labels[i] for i in rows],  # type: ignore[misc]
            index=[self.index[i] for i in rows],
        )


@dataclass
class TaskData:
    task: GlueTask
    train: Split
    dev: dict[str, Split]  # "dev", or MNLI's "dev_matched" and "dev_mismatched"
    source: str


def _check_score(task: GlueTask, score: float, what: str) -> float:
    lo, hi = task.regression_range  # type: ignore[misc]
    if not math.isfinite(score) or not lo <= score <= hi:
        raise TupeError(f"{what} is outside the {task.name} range {lo:g}-{hi:g}")
    return score


def _any_label(raw: object, where: str) -> str:
    """A label of a label set learnt from the file (`tupe finetune --task classification`): any text but none, so
    that an empty cell is not a class of its own (a 3-way head `['', 'neg', 'pos']`); `tupe glue` refuses it too."""
    value = str(raw).strip()
    if not value:
        raise TupeError(f"{where}: empty label {raw!r}; every example needs one (or remove the row)")
    return value


def _parse_label(task: GlueTask, raw: str, where: str) -> int | float:
    value = raw.strip()
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            raise TupeError(
                f"{where}: score {raw!r} is not a number (column {task.label_column!r})"
            ) from None
        return _check_score(task, score, f"{where}: score {raw!r}")
    if task.tsv_labels == ANY_LABEL:
        return _any_label(raw, where)  # type: ignore[return-value]  (a label set still to be learnt from the file)
    try:
        return task.tsv_labels.index(value)
    except ValueError:
        raise TupeError(
            f"{where}: unknown label {raw!r} for {task.name} (expected one of: {', '.join(task.tsv_labels)})"
        ) from None


GLUE_FILE_LIMIT = 4 << 30  # the largest GLUE file (QQP/MNLI train) is under 500 MB
MAX_SENTENCE_CHARS = 1 << 20  # GLUE sentences are a few hundred characters; a megabyte is not a sentence


def _decoded(path: Path, what: str) -> str:
    from tupe.io.reading import read_bytes

    if not os.path.lexists(path):
        raise TupeError(f"{path}: no such file (expected {what})")
    # regular files only (a FIFO or a device would block or never end), bounded; bytes, not read_text:
    # universal-newline mode would also split rows on a lone "\r" inside a sentence
    data = read_bytes(path, GLUE_FILE_LIMIT, what)
    try:  # every line ending as "\n" (CR-only files too); utf-8-sig drops a byte-order mark (MRPC's files have one)
        return line_ends(data.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise TupeError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _sentence(value: object, where: str) -> str:
    """A sentence cell: a string (a number is taken as its text), of a sane length; anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        kind = (
            "an object" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        )
        raise TupeError(f"{where}: a sentence must be a string, got {kind}")
    text = str(value)
    if len(text) > MAX_SENTENCE_CHARS:
        raise TupeError(f"{where}: a sentence of {len(text):,} characters; is it the right file?")
    return text


def tsv_rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of a tab-separated text with quoting off. Split on "\n" only: str.splitlines would
    also split on the form feeds and Unicode separators that a few GLUE sentences contain. Line ends of any kind
    (tupe.io.reading.line_ends)."""
    lines = line_ends(text).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(n, line.rstrip("\r").split("\t")) for n, line in enumerate(lines, start=1)]


def csv_rows(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """(line number where the row starts, fields) of a CSV text (RFC 4180 quoting; a field may span lines)."""
    import csv
    import io

    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows: list[tuple[int, list[str]]] = []
    start = 1
    try:
        for fields in reader:
            rows.append((start, fields if fields else [""]))
            start = reader.line_num + 1
    except csv.Error as err:
        raise TupeError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None
    return rows


def read_delimited(task: GlueTask, path: str | Path, delimiter: str = "\t") -> Split:
    """Read one TSV (quoting off, as GLUE's files need) or CSV (`delimiter=","`, quoted fields) file of `task`;
    any malformed row is an error naming file and line."""
    path = Path(path)
    kind = "tab-separated" if delimiter == "\t" else "comma-separated"
    text = _decoded(
        path, f"the {task.name} layout" if task.name not in TASKS else f"the GLUE {task.name} layout"
    )
    rows = tsv_rows(text) if delimiter == "\t" else csv_rows(path, text)
    if task.header:
        if not rows:
            raise TupeError(f"{path}:1: empty file, expected a header line")
        header = [h.strip() for h in rows[0][1]]
        for name in (*task.text_columns, task.label_column):
            if name not in header:
                raise TupeError(
                    f"{path}:1: missing column {name!r} for {task.name} (header has: {', '.join(header)[:200]})"
                )
        if task.n_columns is not None and len(header) != task.n_columns:
            raise TupeError(
                f"{path}:1: {task.name} header has {len(header)} columns, expected {task.n_columns} "
                f"({', '.join(header)[:200]})"
            )
        n_columns = len(header)
        cols = [header.index(c) for c in task.text_columns]
        label_col = header.index(task.label_column)
        rows = rows[1:]
    else:
        n_columns = task.n_columns or 0
        cols = [int(c) for c in task.text_columns]
        label_col = int(task.label_column)

    text_a: list[str] = []
    text_b: list[str] = []
    labels: list[int | float] = []
    index: list[int] = []
    for lineno, fields in rows:
        if fields == [""]:
            continue
        where = f"{path}:{lineno}"
        if len(fields) != n_columns:
            raise TupeError(
                f"{where}: malformed row: {len(fields)} {kind} fields, expected {n_columns} for {task.name}"
            )
        labels.append(_parse_label(task, fields[label_col], where))
        text_a.append(_sentence(fields[cols[0]], where))
        if task.is_pair:
            text_b.append(_sentence(fields[cols[1]], where))
        index.append(lineno)
    if not labels:
        raise TupeError(f"{path}: no examples")
    return Split(str(path), text_a, text_b if task.is_pair else None, labels, index)  # type: ignore[arg-type]


def read_tsv(task: GlueTask, path: str | Path) -> Split:
    """Read one GLUE TSV file of `task` with quoting off; any malformed row is an error naming file and line."""
    return read_delimited(task, path, "\t")


def find_task_dir(task: GlueTask, root: Path) -> Path | None:
    """`root/TASK` under any common spelling, or `root` itself if it holds the task's train.tsv."""
    if root.is_dir():
        for child in sorted(root.iterdir()):
            if child.is_dir() and _norm(child.name) in {
                _norm(task.name),
                task.hf_name,
                *(_norm(a) for a in task.aliases),
            }:
                return child
    return None


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file()


def _from_datasets(task: GlueTask, dsd, source: str) -> TaskData:  # noqa: ANN001 (a datasets.DatasetDict)
    splits = {"train": "train", **task.hf_dev_splits}
    out: dict[str, Split] = {}
    for ours, theirs in splits.items():
        if theirs not in dsd:
            raise TupeError(f"{source}: no {theirs!r} split for {task.name} (has: {', '.join(dsd)})")
        out[ours] = _split_from_dataset(task, dsd[theirs], f"{source} [{theirs}]")
    return TaskData(task, out.pop("train"), out, source)


def _split_from_dataset(task: GlueTask, ds, where: str) -> Split:  # noqa: ANN001 (a datasets.Dataset)
    """One split in the `datasets` GLUE columns (`sentence1`/`premise`/..., `label` ids, `idx`)."""
    for col in (*task.hf_text_columns, "label"):
        if col not in ds.column_names:
            raise TupeError(
                f"{where}: missing column {col!r} for {task.name} (has: {', '.join(ds.column_names)})"
            )
    labels = list(ds["label"])
    if task.tsv_labels == ANY_LABEL:
        names = getattr(ds.features["label"], "names", None)  # a ClassLabel: its names
        labels = [
            names[x]
            if names and isinstance(x, int) and 0 <= x < len(names)
            else _any_label(x, f"{where} row {i}")
            for i, x in enumerate(labels)
        ]
    elif task.is_regression:
        labels = [_check_score(task, float(x), f"{where} row {i}: score {x!r}") for i, x in enumerate(labels)]
    else:
        bad = [i for i, x in enumerate(labels) if not 0 <= int(x) < task.num_labels]
        if bad:
            raise TupeError(
                f"{where} row {bad[0]}: unknown label {labels[bad[0]]!r} for {task.name} "
                f"(expected 0..{task.num_labels - 1}; test splits have no labels)"
            )
        labels = [int(x) for x in labels]
    text_a = [str(x) for x in ds[task.hf_text_columns[0]]]
    text_b = [str(x) for x in ds[task.hf_text_columns[1]]] if task.is_pair else None
    index = list(ds["idx"]) if "idx" in ds.column_names else list(range(len(labels)))
    if not labels:
        raise TupeError(f"{where}: no examples")
    return Split(where, text_a, text_b, labels, index)


_DATA_EXTENSIONS = (("parquet", "parquet"), ("jsonl", "json"), ("json", "json"))


def _split_files(folder: Path, split: str) -> tuple[str, list[str]] | None:
    """The files of one split in the `datasets` on-disk layout (`train-00000-of-00001.parquet`, `train.parquet`,
    `validation_matched.jsonl`, ... as on the Hub and in its cache): (builder, files), or None."""
    for ext, builder in _DATA_EXTENSIONS:
        files = sorted({*folder.glob(f"{split}.{ext}"), *folder.glob(f"{split}-*.{ext}")})
        if files:
            return builder, [str(f) for f in files]
    return None


def _from_data_files(task: GlueTask, folder: Path) -> TaskData | None:
    """A task stored as parquet/JSON files per split (the `datasets` GLUE layout), or None if not that layout."""
    wanted = ["train", *task.hf_dev_splits.values()]
    found = {split: _split_files(folder, split) for split in wanted}
    if found["train"] is None:
        return None
    missing = [s for s, f in found.items() if f is None]
    if missing:
        raise TupeError(f"{folder}: {task.name} train files found but no {missing[0]!r} split files")
    import datasets

    from tupe.io.reading import check_json_rows

    for builder, files in found.values():  # type: ignore[misc]
        for f in files:
            if builder == "json":
                check_json_rows(f, "GLUE file")  # null or a number would crash datasets' reader (a segfault)
            else:
                _check_parquet_columns(task, f)
    try:
        dsd = datasets.DatasetDict(
            {
                split: datasets.load_dataset(builder, data_files=files, split="train")
                for split, (builder, files) in found.items()  # type: ignore[misc]
            }
        )
    except Exception as err:  # noqa: BLE001 - unreadable parquet/JSON: one line for the user
        raise TupeError(f"{folder}: cannot read the {task.name} data files: {one_line(err)}") from None
    return _from_datasets(task, dsd, str(folder))


def load_task(task: GlueTask | str, data_dir: str | Path) -> TaskData:
    """Read `task`'s train and dev splits from `data_dir`.

    `data_dir` may be: the GLUE root (holding `TASK/train.tsv`, `TASK/dev.tsv`), the task directory itself, a
    `datasets` GLUE copy saved with `save_to_disk` (the task's DatasetDict, or a folder holding one per task under
    its `datasets` name), the `datasets` GLUE files (`TASK/train-00000-of-00001.parquet`,
    `TASK/validation-*.parquet`, or .json/.jsonl; the Hub's layout and its cache's snapshots), or `hub:` / `hub:REPO` to load `nyu-mll/glue` (or REPO) from the Hugging Face hub.
    """
    task = get_task(task) if isinstance(task, str) else task
    spec = str(data_dir)
    if spec.startswith("hub:") or spec == "hub":
        repo = spec[4:] or "nyu-mll/glue"
        import datasets

        try:
            dsd = datasets.load_dataset(repo, task.hf_name)
        except Exception as err:  # network, missing repo, ...: one line for the user
            raise TupeError(
                f"could not load {repo!r} ({task.hf_name}) from the hub: {one_line(err)}"
            ) from None
        return _from_datasets(task, dsd, f"hub:{repo}/{task.hf_name}")

    root = Path(data_dir)
    if not root.exists():
        raise TupeError(f"{root}: no such directory (expected a GLUE data directory)")
    candidates = [c for c in (find_task_dir(task, root), root) if c is not None]
    for cand in candidates:
        if (cand / task.train_file).is_file():
            train = read_split_file(task, cand / task.train_file)
            dev = {name: read_split_file(task, cand / fname) for name, fname in task.dev_files.items()}
            return TaskData(task, train, dev, str(cand))
        if _is_saved_dataset(cand):
            import datasets

            try:
                dsd = datasets.load_from_disk(str(cand))
            except Exception as err:  # a damaged or foreign folder: one line for the user
                raise TupeError(f"{cand}: cannot load the saved dataset: {one_line(err)}") from None
            if not isinstance(dsd, datasets.DatasetDict):
                raise TupeError(f"{cand}: a single saved split; expected a DatasetDict with train/validation")
            return _from_datasets(task, dsd, str(cand))
        from_files = _from_data_files(task, cand)
        if from_files is not None:
            return from_files
    raise TupeError(
        f"{root}: no {task.name} data found: expected {root}/{task.name}/{task.train_file} (GLUE layout), "
        f"{root}/{task.train_file}, a `datasets` DatasetDict saved with save_to_disk, or the `datasets` GLUE files "
        f"({root}/{task.hf_name}/train-*.parquet, validation-*.parquet; .json/.jsonl too)"
    )


def split_from_json(task: GlueTask, path: str | Path) -> Split:
    """Read a split from JSON records (a list, a dict of records, or JSON lines).

    Each record has `text_a`/`text_b`/`label` or the `datasets` column names; labels are the TSV strings, the
    label names, or ids. This is the format of the MNLI sample shipped with some GLUE subsets.
    """
    path = Path(path)
    if not path.is_file():
        raise TupeError(f"{path}: no such file")
    text = _decoded(path, "a JSON or JSON-lines file")
    records: list[tuple[int, dict]] = []
    try:
        data = json.loads(text)
        if not isinstance(data, dict | list):
            raise TupeError(
                f"{path}: expected JSON objects (one per line, or a list of them), got {json_type_name(data)}"
            )
        items = data.values() if isinstance(data, dict) else data
        records = [(i, r) for i, r in enumerate(items)]
        line_of = None
    except RecursionError:
        raise TupeError(f"{path}: JSON nested too deeply to be read") from None
    except json.JSONDecodeError:
        line_of = {}
        for lineno, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    records.append((lineno, json.loads(line)))
                except RecursionError:
                    raise TupeError(f"{path}:{lineno}: JSON nested too deeply to be read") from None
                except json.JSONDecodeError as err:
                    raise TupeError(f"{path}:{lineno}: not JSON ({err.msg})") from None
    cols_a = ("text_a", task.hf_text_columns[0], task.text_columns[0])
    cols_b = ("text_b", *task.hf_text_columns[1:2], *task.text_columns[1:2])
    text_a: list[str] = []
    text_b: list[str] = []
    labels: list[int | float] = []
    index: list[int] = []
    for pos, rec in records:
        where = f"{path}:{pos}" if line_of is not None else f"{path} record {pos}"
        if not isinstance(rec, dict):
            raise TupeError(f"{where}: expected a JSON object")
        col_a = next((c for c in cols_a if c in rec), None)
        col_b = next((c for c in cols_b if c in rec), None) if task.is_pair else None
        if col_a is None or (task.is_pair and col_b is None) or "label" not in rec:
            raise TupeError(f"{where}: missing text_a/text_b/label for {task.name} (has: {', '.join(rec)})")
        a, b = rec[col_a], rec[col_b] if col_b is not None else ""
        for col, value in ((col_a, a), (col_b, b), ("label", rec["label"])):
            if value is None:
                raise TupeError(
                    f"{where}: {col!r} is null; expected a {'label' if col == 'label' else 'sentence'}"
                )
        raw = rec["label"]
        if isinstance(raw, dict | list):
            raise TupeError(
                f"{where}: label {json.dumps(raw)[:60]} is {json_type_name(raw)}; expected one label (a string "
                "or a number)"
            )
        if task.tsv_labels == ANY_LABEL:
            label = _any_label(raw, where)
        elif not task.is_regression and isinstance(raw, int) and not isinstance(raw, bool):
            if not 0 <= raw < task.num_labels:
                raise TupeError(f"{where}: unknown label {raw!r} for {task.name}")
            label: int | float | str = raw
        elif not task.is_regression and str(raw) in task.label_names and str(raw) not in task.tsv_labels:
            label = task.label_names.index(str(raw))
        else:
            label = _parse_label(task, str(raw), where)
        text_a.append(_sentence(a, where))
        text_b.append(_sentence(b, where))
        labels.append(label)
        index.append(pos)
    if not labels:
        raise TupeError(f"{path}: no examples")
    return Split(str(path), text_a, text_b if task.is_pair else None, labels, index)  # type: ignore[arg-type]


def split_from_parquet(task: GlueTask, path: str | Path) -> Split:
    """A split from one parquet file in the `datasets` GLUE columns (a file of the Hub's `TASK/*.parquet`)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise TupeError(f"{path}: no such file")
    _check_parquet_columns(task, path)
    import datasets

    try:
        ds = datasets.load_dataset("parquet", data_files=[str(path)], split="train")
    except Exception as err:  # noqa: BLE001 - not parquet: one line for the user
        raise TupeError(f"{path}: cannot read it as parquet: {one_line(err)}") from None
    return _split_from_dataset(task, ds, str(path))


def _check_parquet_columns(task: GlueTask, path: str | Path) -> None:
    """The file's parquet footer only (bounded, see `check_parquet`): refuse a file without the task's columns
    before `datasets` reads (and caches) all of its rows."""
    from tupe.io.reading import check_parquet

    names = check_parquet(path, "GLUE file")
    for col in (*task.hf_text_columns, "label"):
        if col not in names:
            raise TupeError(f"{path}: missing column {col!r} for {task.name} (has: {', '.join(names)[:200]})")


def read_split_file(task: GlueTask, path: str | Path) -> Split:
    """A split from one file, by its suffix: `.csv` (quoted CSV), `.json`/`.jsonl` records, `.parquet` or a folder
    saved with `save_to_disk` in the `datasets` columns, anything else (`.tsv`) as GLUE's TSV (quoting off)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if path.is_dir():
        return split_from_saved_dataset(task, path)
    if suffix == ".parquet":
        return split_from_parquet(task, path)
    if suffix == ".csv":
        return read_delimited(task, path, ",")
    return split_from_json(task, path) if suffix in {".json", ".jsonl"} else read_tsv(task, path)


def split_from_saved_dataset(task: GlueTask, path: str | Path) -> Split:
    """A split from a `datasets.Dataset` saved with `save_to_disk` (one split, in the `datasets` columns)."""
    path = Path(path)
    if not _is_saved_dataset(path):
        raise TupeError(f"{path}: a folder, but not a dataset saved with save_to_disk (no dataset_info.json)")
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - a damaged or foreign folder: one line for the user
        raise TupeError(f"{path}: cannot load the saved dataset: {one_line(err)}") from None
    if isinstance(ds, datasets.DatasetDict):
        raise TupeError(
            f"{path}: a DatasetDict ({', '.join(ds)}); name one split's folder, or use --data-dir"
        )
    return _split_from_dataset(task, ds, str(path))
