"""Readers for every GLUE layout, on fixtures written by the tests (BOM, stray quotes, no header, MNLI's two
dev files), and one-line errors naming file and line for bad input."""

import json

import pytest

from tupe.errors import TupeError
from tupe.finetuning.glue.tasks import TASKS, get_task, load_task, read_split_file, read_tsv

from .fixtures import ALL_TASKS, write_task


def test_task_table_matches_the_paper_protocol():
    assert set(TASKS) == set(ALL_TASKS)
    assert {n for n, t in TASKS.items() if t.epochs == 5} == {"MNLI", "QQP", "QNLI"}
    assert get_task("STS-B").is_regression and get_task("STS-B").num_labels == 1
    assert get_task("CoLA").main_metric == "mcc"
    assert get_task("STS-B").main_metric == "pearson"
    assert get_task("MRPC").metrics == ("accuracy", "f1") and get_task("QQP").metrics == ("accuracy", "f1")
    assert get_task("MNLI").num_labels == 3


@pytest.mark.parametrize("spelling", ["sst2", "SST-2", "sst-2", "Sst2"])
def test_task_aliases(spelling):
    assert get_task(spelling).name == "SST-2"


def test_unknown_task():
    with pytest.raises(TupeError, match="unknown GLUE task 'MRCP'"):
        get_task("MRCP")


@pytest.mark.parametrize("task", ALL_TASKS)
def test_every_layout_reads(glue_dir, task):
    data = load_task(task, glue_dir)
    t = get_task(task)
    assert len(data.train) == 48
    assert set(data.dev) == set(t.hf_dev_splits)
    assert all(len(s) == 24 for s in data.dev.values())
    assert (data.train.text_b is not None) == t.is_pair
    if t.is_regression:
        assert all(isinstance(y, float) and 0 <= y <= 5 for y in data.train.labels)
    else:
        assert set(data.train.labels) == set(range(t.num_labels))
    # line numbers: headerless CoLA starts at line 1, the others at 2
    assert data.train.index[0] == (1 if task == "CoLA" else 2)


def test_mrpc_bom_and_stray_quotes_are_kept_verbatim(glue_dir):
    raw = (glue_dir / "MRPC" / "train.tsv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfQuality")
    data = load_task("MRPC", glue_dir)
    texts = data.train.text_a + data.train.text_b
    quoted = [s for s in texts if '"' in s]
    assert quoted, "fixture should contain stray quotes"
    # each stray quote survives: quoting is off, so no row swallowed the next one
    assert sum(s.count('"') for s in texts) == raw.count(b'"')
    assert len(data.train) == raw.count(b"\n") - 1


def test_cola_columns(glue_dir):
    lines = (glue_dir / "CoLA" / "dev.tsv").read_text().split("\n")
    data = load_task("CoLA", glue_dir)
    source, label, mark, sentence = lines[0].split("\t")
    assert data.dev["dev"].text_a[0] == sentence
    assert data.dev["dev"].labels[0] == int(label)


def test_sts_scores_are_floats(glue_dir):
    lines = (glue_dir / "STS-B" / "dev.tsv").read_text().split("\n")
    data = load_task("STS-B", glue_dir)
    assert data.dev["dev"].labels[3] == float(lines[4].split("\t")[-1])
    assert data.dev["dev"].text_b[3] == lines[4].split("\t")[8]


def test_mnli_labels_and_dev_files(glue_dir):
    data = load_task("MNLI", glue_dir)
    assert set(data.dev) == {"dev_matched", "dev_mismatched"}
    assert data.train.labels[:3] == [0, 1, 2]  # entailment, neutral, contradiction (the datasets ids)
    assert data.dev["dev_mismatched"].source.endswith("dev_mismatched.tsv")


def test_data_dir_can_be_the_task_folder_or_lowercase(tmp_path, glue_dir):
    assert len(load_task("RTE", glue_dir / "RTE").train) == 48
    write_task(tmp_path, "RTE")
    (tmp_path / "RTE").rename(tmp_path / "rte")
    assert len(load_task("RTE", tmp_path).train) == 48


def _rewrite(path, lineno, new_line):
    lines = path.read_text(encoding="utf-8-sig").split("\n")
    lines[lineno - 1] = new_line
    path.write_text("\n".join(lines))


def test_malformed_row_names_file_and_line(tmp_path):
    d = write_task(tmp_path, "MRPC")
    _rewrite(d / "train.tsv", 7, "1\t123\tonly three fields")
    with pytest.raises(TupeError) as err:
        load_task("MRPC", tmp_path)
    msg = str(err.value)
    assert f"{d / 'train.tsv'}:7:" in msg and "3 tab-separated fields, expected 5" in msg
    assert "\n" not in msg


def test_unknown_label_names_file_line_and_value(tmp_path):
    d = write_task(tmp_path, "RTE")
    lines = (d / "dev.tsv").read_text().split("\n")
    fields = lines[4].split("\t")
    fields[-1] = "entailed"
    _rewrite(d / "dev.tsv", 5, "\t".join(fields))
    with pytest.raises(TupeError, match=r"dev\.tsv:5: unknown label 'entailed' for RTE"):
        load_task("RTE", tmp_path)


def test_missing_column_names_file(tmp_path):
    d = write_task(tmp_path, "QNLI")
    _rewrite(d / "train.tsv", 1, "index\tquestion\ttext\tlabel")
    with pytest.raises(TupeError, match=r"train\.tsv:1: missing column 'sentence' for QNLI"):
        load_task("QNLI", tmp_path)


def test_bad_sts_score(tmp_path):
    d = write_task(tmp_path, "STS-B")
    fields = (d / "train.tsv").read_text().split("\n")[2].split("\t")
    fields[-1] = "7.5"
    _rewrite(d / "train.tsv", 3, "\t".join(fields))
    with pytest.raises(TupeError, match=r"train\.tsv:3: score '7.5' is outside the STS-B range"):
        load_task("STS-B", tmp_path)


def test_missing_data(tmp_path):
    with pytest.raises(TupeError, match="no CoLA data found"):
        load_task("CoLA", tmp_path)
    with pytest.raises(TupeError, match="no such directory"):
        load_task("CoLA", tmp_path / "nope")
    (tmp_path / "CoLA").mkdir()
    (tmp_path / "CoLA" / "train.tsv").write_text("gj04\t1\t\tok .\n")
    with pytest.raises(TupeError, match=r"dev\.tsv: no such file"):
        load_task("CoLA", tmp_path)


def test_crlf_and_form_feed_inside_a_sentence(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_bytes(b"sentence\tlabel\r\na\x0cb \t1\r\nc\rd\xe2\x80\xa8e \t0\r\n")
    split = read_tsv(get_task("SST-2"), f)
    assert split.text_a == ["a\x0cb ", "c\rd\u2028e "] and split.labels == [1, 0]


def test_saved_datasets_copy_matches_tsv(tmp_path, glue_dir):
    datasets = pytest.importorskip("datasets")
    tsv = load_task("MNLI", glue_dir)
    names = ["entailment", "neutral", "contradiction"]
    feats = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=names),
            "idx": datasets.Value("int32"),
        }
    )

    def ds(split):
        return datasets.Dataset.from_dict(
            {
                "premise": split.text_a,
                "hypothesis": split.text_b,
                "label": split.labels,
                "idx": list(range(len(split))),
            },
            features=feats,
        )

    dsd = datasets.DatasetDict(
        train=ds(tsv.train),
        validation_matched=ds(tsv.dev["dev_matched"]),
        validation_mismatched=ds(tsv.dev["dev_mismatched"]),
    )
    dsd.save_to_disk(str(tmp_path / "mnli"))
    for where in (tmp_path / "mnli", tmp_path):  # the DatasetDict itself, or a folder of them by name
        got = load_task("MNLI", where)
        assert got.train.text_a == tsv.train.text_a and got.train.labels == tsv.train.labels
        assert got.dev["dev_mismatched"].labels == tsv.dev["dev_mismatched"].labels


def test_datasets_copy_with_test_labels_is_an_error(tmp_path):
    datasets = pytest.importorskip("datasets")
    d = datasets.Dataset.from_dict({"sentence": ["a", "b"], "label": [1, -1]})
    datasets.DatasetDict(train=d, validation=d).save_to_disk(str(tmp_path / "sst2"))
    with pytest.raises(TupeError, match=r"\[train\] row 1: unknown label -1 for SST-2"):
        load_task("SST-2", tmp_path)


def test_json_records(tmp_path):
    recs = {
        "0": {"text_a": "a b", "text_b": "c", "label": "neutral"},
        "1": {"text_a": 'd "e', "text_b": "f", "label": "contradiction"},
    }
    f = tmp_path / "dev.json"
    f.write_text(json.dumps(recs))
    split = read_split_file(get_task("MNLI"), f)
    assert split.labels == [1, 2] and split.text_a[1] == 'd "e'
    g = tmp_path / "train.jsonl"
    g.write_text('{"sentence1": "x", "sentence2": "y", "label": 1}\n{"sentence1": "x", "label": 0}\n')
    with pytest.raises(TupeError, match=r"train\.jsonl:2: missing text_a/text_b/label"):
        read_split_file(get_task("RTE"), g)


def test_train_and_dev_files_instead_of_a_folder(glue_dir):
    from tupe.finetuning.glue.encoding import load_data

    mnli = get_task("MNLI")
    one = load_data(
        mnli, None, str(glue_dir / "MNLI" / "train.tsv"), [str(glue_dir / "MNLI" / "dev_matched.tsv")]
    )
    assert list(one.dev) == ["dev_matched"] and len(one.train) == 48
    both = [str(glue_dir / "MNLI" / f) for f in ("dev_matched.tsv", "dev_mismatched.tsv")]
    assert list(load_data(mnli, None, str(glue_dir / "MNLI" / "train.tsv"), both).dev) == [
        "dev_matched",
        "dev_mismatched",
    ]
    with pytest.raises(TupeError, match="2 --dev-file given; RTE has 1 dev split"):
        load_data(get_task("RTE"), None, str(glue_dir / "RTE" / "train.tsv"), both)
    with pytest.raises(TupeError, match="go together"):
        load_data(get_task("RTE"), None, str(glue_dir / "RTE" / "train.tsv"), None)


def test_last_row_without_newline_and_empty_sentence(tmp_path):
    f = tmp_path / "dev.tsv"
    f.write_bytes(
        b"gj04\t1\t\tfirst .\ngj04\t0\t*\t\ngj04\t1\t\tlast, no newline ."
    )  # like the real CoLA dev
    split = read_tsv(get_task("CoLA"), f)
    assert split.text_a == ["first .", "", "last, no newline ."] and split.index == [1, 2, 3]


def test_datasets_parquet_and_json_layout_matches_tsv(tmp_path, glue_dir):
    """The files `datasets` users have on disk: the Hub's `mnli/train-00000-of-00001.parquet` layout (also what
    the Hub cache's snapshots hold), and one JSON-lines file per split."""
    datasets = pytest.importorskip("datasets")
    tsv = load_task("MNLI", glue_dir)
    root = tmp_path / "glue-parquet"
    (root / "mnli").mkdir(parents=True)
    for name, split in (
        ("train", tsv.train),
        ("validation_matched", tsv.dev["dev_matched"]),
        ("validation_mismatched", tsv.dev["dev_mismatched"]),
        ("test_matched", tsv.dev["dev_matched"]),
    ):
        d = datasets.Dataset.from_dict(
            {"premise": split.text_a, "hypothesis": split.text_b, "label": split.labels, "idx": split.index}
        )
        d.to_parquet(str(root / "mnli" / f"{name}-00000-of-00001.parquet"))
    got = load_task("MNLI", root)
    assert got.train.text_a == tsv.train.text_a and got.train.labels == tsv.train.labels
    assert got.dev["dev_mismatched"].text_b == tsv.dev["dev_mismatched"].text_b
    assert got.source == str(root / "mnli")

    sst = load_task("SST-2", glue_dir)
    jroot = tmp_path / "sst2"
    jroot.mkdir()
    for name, split in (("train", sst.train), ("validation", sst.dev["dev"])):
        lines = [json.dumps({"sentence": a, "label": y}) for a, y in zip(split.text_a, split.labels)]
        (jroot / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    got = load_task("SST-2", jroot)
    assert got.dev["dev"].labels == sst.dev["dev"].labels and got.train.text_a == sst.train.text_a

    (jroot / "validation.jsonl").unlink()
    with pytest.raises(TupeError, match="train files found but no 'validation' split files"):
        load_task("SST-2", jroot)


def test_train_and_dev_parquet_files(tmp_path, glue_dir, monkeypatch):
    """`--train-file`/`--dev-file` take single parquet files of the `datasets` GLUE too (e.g. copied out of the
    Hub cache's `mrpc/train-00000-of-00001.parquet`)."""
    datasets = pytest.importorskip("datasets")
    from tupe.finetuning.glue.encoding import load_data

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")  # its Arrow copies

    mrpc = get_task("MRPC")
    tsv = load_task(mrpc, glue_dir)
    files = {}
    for name, split in (("train", tsv.train), ("validation", tsv.dev["dev"])):
        files[name] = tmp_path / f"{name}-00000-of-00001.parquet"
        datasets.Dataset.from_dict(
            {"sentence1": split.text_a, "sentence2": split.text_b, "label": split.labels, "idx": split.index}
        ).to_parquet(str(files[name]))
    got = load_data(mrpc, None, str(files["train"]), [str(files["validation"])])
    assert got.train.text_b == tsv.train.text_b and got.dev["dev"].labels == tsv.dev["dev"].labels
    bad = tmp_path / "test.parquet"
    datasets.Dataset.from_dict(
        {"sentence1": ["a"], "sentence2": ["b"], "label": [-1], "idx": [0]}
    ).to_parquet(str(bad))
    with pytest.raises(
        TupeError, match=r"test\.parquet row 0: unknown label -1 for MRPC .*test splits have no labels"
    ):
        read_split_file(mrpc, bad)
    wrong = tmp_path / "sst.parquet"
    datasets.Dataset.from_dict({"text": ["a"], "label": [0]}).to_parquet(str(wrong))
    with pytest.raises(
        TupeError, match=r"sst\.parquet: missing column 'sentence' for SST-2 \(has: text, label\)"
    ):
        read_split_file(get_task("SST-2"), wrong)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(TupeError, match=r"junk\.parquet: cannot read it as parquet"):
        read_split_file(mrpc, tmp_path / "junk.parquet")


def test_a_csv_task_is_one_table_entry(tmp_path, monkeypatch):
    """A user's task is one `GlueTask` entry: read from quoted CSV files, its label set checked, its own
    regression range, and a `tupe report` column of its own."""
    from tupe.finetuning.glue import tasks as T
    from tupe.finetuning.glue.report import task_columns

    monkeypatch.setattr(T, "TASKS", dict(T.TASKS))
    task = T.register_task(
        T.GlueTask(
            name="Reviews",
            text_columns=("review",),
            label_column="stars",
            tsv_labels=("1", "2", "3"),
            train_file="train.csv",
            dev_files={"dev": "dev.csv"},
        )
    )
    d = tmp_path / "reviews"
    d.mkdir()
    (d / "train.csv").write_text('id,review,stars\n1,"fine, if long",3\n2,"said ""no""\nthen left",1\n')
    (d / "dev.csv").write_text("id,review,stars\n7,ok,2\n")
    data = load_task("reviews", tmp_path)
    assert data.train.text_a == ["fine, if long", 'said "no"\nthen left'] and data.train.labels == [2, 0]
    assert data.train.index == [2, 3] and data.dev["dev"].labels == [1]
    assert task.main_metric == "accuracy" and task.hf_dev_splits == {"dev": "validation"}
    assert ("Reviews", "Reviews", "dev", "accuracy") in task_columns()
    (d / "dev.csv").write_text("id,review,stars\n7,ok,2\n8,bad,6\n")
    with pytest.raises(TupeError, match=r"dev\.csv:3: unknown label '6' for Reviews"):
        load_task("Reviews", tmp_path)
    (d / "dev.csv").write_text("id,review,stars\n7,ok\n")
    with pytest.raises(TupeError, match=r"dev\.csv:2: malformed row: 2 comma-separated fields, expected 3"):
        load_task("Reviews", tmp_path)
    with pytest.raises(TupeError, match="already in the table"):
        T.register_task(task)

    score = T.GlueTask(
        name="Score", text_columns=("a", "b"), regression_range=(-1.0, 1.0), metrics=("pearson",)
    )
    f = tmp_path / "s.csv"
    f.write_text("a,b,label\nx,y,-0.5\nx,z,2\n")
    with pytest.raises(TupeError, match=r"s\.csv:3: score '2' is outside the Score range -1-1"):
        read_split_file(score, f)


def test_a_task_entry_is_checked():
    from tupe.finetuning.glue.tasks import GlueTask

    with pytest.raises(ValueError, match="either tsv_labels or regression_range"):
        GlueTask(name="X", text_columns=("a",))
    with pytest.raises(ValueError, match="main_metric 'mcc' is not one of its metrics"):
        GlueTask(name="X", text_columns=("a",), tsv_labels=("0", "1"), main_metric="mcc")
    with pytest.raises(ValueError, match="f1 is the binary F1 of label 1; with 5 labels use macro_f1"):
        GlueTask(name="X", text_columns=("a",), tsv_labels=tuple("12345"), metrics=("accuracy", "f1"))
    with pytest.raises(ValueError, match="unknown metric 'auc'; known: accuracy, f1, macro_f1"):
        GlueTask(name="X", text_columns=("a",), tsv_labels=("0", "1"), metrics=("auc",))
    with pytest.raises(ValueError, match="pearson does not apply to a task with labels"):
        GlueTask(name="X", text_columns=("a",), tsv_labels=("0", "1"), metrics=("pearson",))
    with pytest.raises(ValueError, match="accuracy does not apply to a regression task"):
        GlueTask(name="X", text_columns=("a",), regression_range=(0.0, 1.0))  # the default metric: accuracy


def test_macro_f1_is_the_mean_of_the_classes_f1() -> None:
    from tupe.finetuning.glue.metrics import compute_metrics

    labels, predictions = [0, 1, 2, 2, 1, 0], [0, 2, 2, 2, 1, 1]
    # class 0: P 1, R 1/2 -> 2/3; class 1: P 1/2, R 1/2 -> 1/2; class 2: P 2/3, R 1 -> 4/5
    expected = (2 / 3 + 1 / 2 + 4 / 5) / 3
    assert compute_metrics(["macro_f1"], labels, predictions)["macro_f1"] == pytest.approx(expected)
