"""`tupe finetune` end to end on the small files of tests/data/finetune, one task family each: results.json with
the family's metric names in [0, 100], per seed below, predictions.jsonl of the best run from which the metrics
are recomputed independently, resume, `tupe report`; and the refusals, one line with nothing written."""

import json

import pytest

from tupe.cli import main


def _finetune(model, task, train, validation, out, *extra):
    return main(
        [
            "finetune",
            "--task",
            task,
            "--model",
            str(model),
            "--train",
            str(train),
            "--validation",
            str(validation),
            "--out",
            str(out),
            "--lrs",
            "1e-3",
            "--seeds",
            "1",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--threads",
            "1",
            "--no-progress",
            *extra,
        ]
    )


def _err(capsys):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _assert_refused(model, cases, out, capsys) -> None:
    """Each ((task, train, validation), message) case: exit 2, one error line holding the message, nothing written."""
    for (task, train, validation), message in cases:
        assert _finetune(model, task, train, validation, out) == 2
        line = _err(capsys)
        assert line.startswith("tupe finetune: error: ") and message in line, line
        assert not out.exists(), (task, message, sorted(p.name for p in out.rglob("*")))


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ner_results_predictions_resume_and_report(tiny_model, data_dir, tmp_path, capsys):
    from seqeval.metrics import f1_score, precision_score

    out = tmp_path / "ner"
    args = (
        tiny_model,
        "ner",
        data_dir / "ner_train.conll",
        data_dir / "ner_valid.txt",
        out,
        "--seeds",
        "1,2",
    )
    assert _finetune(*args) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["task"] == "ner" and r["main_metric"] == "f1" and r["complete"]
    for m in ("f1", "precision", "recall"):
        assert 0 <= r[m] <= 100
        assert r[m] == pytest.approx((r["per_seed"]["1"][m] + r["per_seed"]["2"][m]) / 2)
    assert r["baseline"]["all_O"]["f1"] == 0.0
    rows = _lines(out / "predictions.jsonl")
    assert len(rows) == 16  # one line per validation sentence
    best = max(r["per_seed"].items(), key=lambda kv: kv[1]["f1"])
    assert r["best_run"] == f"lr0.001_seed{best[0]}"
    gold, pred = [x["tags"] for x in rows], [x["predicted"] for x in rows]
    assert 100 * f1_score(gold, pred) == pytest.approx(best[1]["f1"])
    assert 100 * precision_score(gold, pred, zero_division=0) == pytest.approx(best[1]["precision"])

    capsys.readouterr()
    assert _finetune(*args) == 0  # everything finished: nothing is trained again
    assert "2 already done" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| NER F1 |" in table and f"{r['f1']:.2f}" in table


def test_classification_from_csv(tiny_model, data_dir, tmp_path):
    out = tmp_path / "cls"
    assert (
        _finetune(
            tiny_model,
            "classification",
            data_dir / "sentiment_train.csv",
            data_dir / "sentiment_val.csv",
            out,
        )
        == 0
    )
    r = json.loads((out / "results.json").read_text())
    rows = _lines(out / "predictions.jsonl")
    assert r["label_names"] == ["neg", "pos"] and len(rows) == 12
    assert r["accuracy"] == pytest.approx(100 * sum(x["label"] == x["prediction"] for x in rows) / 12)


@pytest.mark.slow
@pytest.mark.parametrize("v2", [False, True])
def test_qa_squad(tiny_model, data_dir, tmp_path, v2):
    from tupe.finetuning.metrics import squad_scores

    out = tmp_path / "qa"
    files = ("squad2_train.json", "squad2_dev.json") if v2 else ("squad_train.json", "squad_dev.json")
    extra = ["--max-seq-len", "48", "--doc-stride", "12", *(["--version-2-with-negative"] if v2 else [])]
    assert _finetune(tiny_model, "qa", data_dir / files[0], data_dir / files[1], out, *extra) == 0
    r = json.loads((out / "results.json").read_text())
    rows = _lines(out / "predictions.jsonl")
    assert len(rows) == (10 if v2 else 8) and {"id", "answers", "prediction"} <= set(rows[0])
    again = squad_scores([x["answers"] for x in rows], [x["prediction"] for x in rows])
    assert r["exact_match"] == pytest.approx(again["exact_match"]) and r["f1"] == pytest.approx(again["f1"])
    assert ("HasAns_exact" in r["per_seed"]["1"]) == v2
    assert r["data"]["validation_features"] > r["data"]["validation_examples"]  # several windows per context


@pytest.mark.slow
def test_multiple_choice_swag(tiny_model, data_dir, tmp_path):
    out = tmp_path / "mc"
    assert (
        _finetune(tiny_model, "multiple-choice", data_dir / "swag_train.csv", data_dir / "swag_val.csv", out)
        == 0
    )
    r = json.loads((out / "results.json").read_text())
    rows = _lines(out / "predictions.jsonl")
    assert len(rows) == 12
    assert r["accuracy"] == pytest.approx(100 * sum(x["label"] == x["prediction"] for x in rows) / 12)
    assert 0 <= r["baseline"]["most_frequent_train_label"]["accuracy"] <= 100


@pytest.mark.slow
def test_early_stopping_keeps_the_best_epoch(tiny_model, data_dir, tmp_path):
    out = tmp_path / "es"
    assert (
        _finetune(
            tiny_model,
            "ner",
            data_dir / "ner_train.conll",
            data_dir / "ner_valid.txt",
            out,
            "--epochs",
            "4",
            "--early-stopping",
            "1",
        )
        == 0
    )
    run = json.loads((out / "runs" / "lr0.001_seed1" / "result.json").read_text())
    assert run["trainer"]["best_checkpoint"].startswith("checkpoint-")
    assert not (out / "runs" / "lr0.001_seed1" / "trainer").exists()


def test_refusals_are_one_line_and_write_nothing(tiny_model, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    bad_tag = tmp_path / "v.txt"
    bad_tag.write_text("Alice B-PER\n\nZurich B-GPE\n")
    bad_squad = tmp_path / "s.json"
    bad_squad.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "paragraphs": [
                            {
                                "context": "It opened in 1931.",
                                "qas": [
                                    {
                                        "id": "x1",
                                        "question": "When?",
                                        "answers": [{"text": "1931", "answer_start": 3}],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        )
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        (("ner", data_dir / "ner_train.conll", bad_tag), "tag 'B-GPE' never occurs in the training file"),
        (
            ("qa", data_dir / "squad_train.json", bad_squad),
            "question 'x1': answer '1931' is not at its answer_start 3",
        ),
        (("ner", data_dir / "ner_train.conll", empty), "empty.txt: empty file"),
        (
            ("ner", data_dir / "squad_train.json", data_dir / "ner_valid.txt"),
            "needs `tokens` and `tags` columns",
        ),
        (("qa", data_dir / "ner_train.conll", data_dir / "squad_dev.json"), "official SQuAD JSON"),
        (
            ("multiple-choice", data_dir / "sentiment_train.csv", data_dir / "swag_val.csv"),
            "needs SWAG columns",
        ),
        (
            ("classification", data_dir / "ner_train.conll", data_dir / "ner_valid.txt"),
            "classification needs a `text`",
        ),
    ]
    _assert_refused(tiny_model, cases, out, capsys)
    assert (
        _finetune(
            tiny_model,
            "ner",
            data_dir / "ner_train.conll",
            data_dir / "ner_valid.txt",
            out,
            "--max-seq-len",
            "128",
        )
        == 2
    )
    assert "--max-seq-len 128 exceeds the model's max_position_embeddings 64" in _err(capsys)
    assert not out.exists()
    assert _finetune(tiny_model, "ner", tmp_path / "nope.txt", data_dir / "ner_valid.txt", out) == 2
    assert "nope.txt" in _err(capsys) and not out.exists()


def test_a_transformers_bert_folder_is_converted_once(data_dir, tokenizer, tmp_path, capsys):
    """`--model` may be a `transformers` BERT folder, as with `tupe glue`: converted exactly to bert-a into
    OUT/converted-bert-a (once), which this command then owns in --out."""
    from transformers import BertConfig, BertForMaskedLM

    bert = tmp_path / "bert"
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    BertForMaskedLM(config).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    out = tmp_path / "out"
    args = (bert, "classification", data_dir / "sentiment_train.csv", data_dir / "sentiment_val.csv", out)
    assert _finetune(*args) == 0
    assert "converted exactly to bert-a" in capsys.readouterr().out
    r = json.loads((out / "results.json").read_text())
    assert r["scheme"] == "bert-a" and (out / "converted-bert-a" / "config.json").is_file()
    assert _finetune(*args) == 0  # resumed: the converted copy is reused, every run already done
    printed = capsys.readouterr().out
    assert "1 already done" in printed and "using its bert-a conversion" in printed
    (bert / "model.safetensors").unlink()  # a BERT folder refused while converting: its error, no "converted"
    out2 = tmp_path / "out2"
    assert _finetune(*args[:-1], out2) == 2
    printed = capsys.readouterr()
    assert "converted" not in printed.out and "model.safetensors" not in printed.out
    assert str(bert) in printed.err and not (out2 / "converted-bert-a").exists()


@pytest.mark.slow
def test_a_google_layout_bert_folder_fine_tunes_for_ner_and_serves_the_pipeline(data_dir, tmp_path):
    """A BERT folder in Google's vocabulary layout ([CLS] 101, as bert-base-uncased), built with transformers
    alone: `tupe finetune --task ner` converts it keeping its ids, trains, and the saved model serves
    transformers' token-classification pipeline with entities at exact spans of the text."""
    from transformers import pipeline

    import tupe  # noqa: F401  (registers the Auto classes)

    from ..helpers import google_bert_folder

    bert = google_bert_folder(tmp_path / "bert", ["alice", "smith", "paris", "berlin", "bob"])
    out = tmp_path / "ner"
    assert (
        _finetune(bert, "ner", data_dir / "ner_train.conll", data_dir / "ner_valid.txt", out, "--save-models")
        == 0
    )
    r = json.loads((out / "results.json").read_text())
    assert r["scheme"] == "bert-a" and r["complete"] and 0 <= r["f1"] <= 100
    converted = json.loads((out / "converted-bert-a" / "config.json").read_text())
    assert (converted["cls_token_id"], converted["sep_token_id"], converted["mask_token_id"]) == (
        101,
        102,
        103,
    )
    model = out / "runs" / "lr0.001_seed1" / "model"
    ner = pipeline("token-classification", model=str(model), aggregation_strategy="simple", device="cpu")
    assert type(ner.model).__name__ == "TupeForTokenClassification"
    assert ner.tokenizer.cls_token_id == ner.model.config.cls_token_id == 101
    text = "Alice Smith flew from Paris to Berlin with Bob ."
    types = {t[2:] for t in r["label_names"] if t != "O"}
    for e in ner(text):
        assert e["entity_group"] in types and 0 <= e["start"] < e["end"] <= len(text)
        assert e["word"] == text[e["start"] : e["end"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "files", "extra"),
    [
        ("classification", ("sentiment_train.csv", "sentiment_val.csv"), ()),
        ("qa", ("squad_train.json", "squad_dev.json"), ("--max-seq-len", "48", "--doc-stride", "12")),
        ("multiple-choice", ("swag_train.csv", "swag_val.csv"), ()),
    ],
)
def test_a_google_layout_bert_folder_fine_tunes_every_family(data_dir, tmp_path, task, files, extra):
    from ..helpers import google_bert_folder

    bert = google_bert_folder(tmp_path / "bert", ["the", "was", "good", "bad"])
    out = tmp_path / task
    assert _finetune(bert, task, data_dir / files[0], data_dir / files[1], out, *extra) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["scheme"] == "bert-a" and r["complete"] and len(_lines(out / "predictions.jsonl")) > 0
    assert json.loads((out / "converted-bert-a" / "config.json").read_text())["cls_token_id"] == 101


def test_more_refusals_name_the_file_line_and_value(tiny_model, data_dir, tmp_path, capsys):
    """What a user's own files get wrong, each one line naming where, with nothing written."""
    out = tmp_path / "out"
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 O\n".encode("latin-1"))
    seen_other_prefix = tmp_path / "v.txt"  # I-group where training only tags groups B-group
    seen_other_prefix.write_text("Kevin B-person\nsaw O\nOKC I-group\n")
    five = tmp_path / "five.txt"  # a tag column, but not the last one
    five.write_text("EU NNP B-NP B-ORG x\nrejects VBZ B-VP O x\n")
    record = tmp_path / "v.jsonl"
    record.write_text('{"tokens": ["Kevin", "OKC"], "tags": ["B-person", "B-team"]}\n')
    long_question = tmp_path / "q.json"
    long_question.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "paragraphs": [
                            {
                                "context": "It opened in 1931.",
                                "qas": [
                                    {
                                        "id": "long",
                                        "question": "When " * 40,
                                        "answers": [{"text": "1931", "answer_start": 13}],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        )
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    wnut = data_dir / "wnut_train.conll"
    cases = [
        (("ner", wnut, latin1), "latin1.txt: not UTF-8 text (byte 0xe9 at offset 3"),
        (
            ("ner", wnut, seen_other_prefix),
            "v.txt:3: tag 'I-group' never occurs in the training file",
        ),
        (("ner", wnut, seen_other_prefix), "(it has B-group)"),
        (("ner", five, data_dir / "wnut_dev.conll"), "five.txt:1: tag 'x' is not an IOB tag"),
        (("ner", five, data_dir / "wnut_dev.conll"), "column 4 ('B-ORG') looks like one"),
        (("ner", wnut, record), "v.jsonl:1: token 2 ('OKC'): tag 'B-team' never occurs"),
        (
            ("qa", data_dir / "squad_train.json", long_question),
            "question 'long' takes",
        ),
        (
            ("qa", folder, data_dir / "squad_dev.json"),
            "folder: question answering reads the official SQuAD JSON",
        ),
        (
            ("ner", folder, data_dir / "wnut_dev.conll"),
            "folder: cannot load it as a dataset saved with save_to_disk",
        ),
        (
            ("multiple-choice", data_dir / "squad2_official_train.json", data_dir / "swag_official_dev.csv"),
            "needs SWAG columns",
        ),
        (
            ("classification", data_dir / "swag_official_train.csv", data_dir / "swag_official_dev.csv"),
            "classification needs a `text`",
        ),
    ]
    _assert_refused(tiny_model, cases, out, capsys)


def test_ner_with_the_habits_of_glue_and_pretrain(tiny_model, data_dir, tmp_path, capsys):
    """Issue 38: --label-all-tokens, --grad-accum, --max-steps, --logging-steps, --eval-steps, --report-to; a model
    card in the saved model naming the aggregation strategy its config.json holds; one seed reported as n/a."""
    out = tmp_path / "ner"
    code = _finetune(
        tiny_model, "ner", data_dir / "ner_train.conll", data_dir / "ner_valid.txt", out,
        "--label-all-tokens", "--save-models", "--grad-accum", "2", "--max-steps", "3", "--logging-steps", "1",
        "--eval-steps", "2", "--report-to", "tensorboard",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    r = json.loads((out / "results.json").read_text())
    run = r["runs"][0]
    assert run["steps"] == 3 and run["trainer"]["gradient_accumulation_steps"] == 2
    assert run["trainer"]["train_batch_size"] == 8  # --batch-size stays the batch of one optimizer step
    assert r["settings"]["label_all_tokens"] is True and r["best"]["std"]["f1"] is None
    model = out / "runs" / "lr0.001_seed1" / "model"
    assert json.loads((model / "config.json").read_text())["aggregation_strategy"] == "average"
    card = (model / "README.md").read_text()
    assert "pipeline_tag: token-classification" in card and 'aggregation_strategy="average"' in card
    assert "AutoModelForTokenClassification" in card and "every sub-token (--label-all-tokens)" in card
    events = list((out / "tensorboard" / "lr0.001_seed1").rglob("events.out.tfevents*"))
    assert events, sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1 seed: f1" in printed and "sd n/a" in printed and "± 0.00" not in printed, printed
