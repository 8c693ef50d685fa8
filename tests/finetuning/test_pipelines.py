"""The pipelines a user reaches for on a model `tupe finetune` saved: `pipeline("question-answering")` (which tupe
registers, transformers 5 having removed it) gives the answers `tupe finetune` wrote to predictions.jsonl, with
`context[start:end] == answer`, over contexts cut into several windows; `pipeline("token-classification",
aggregation_strategy="simple")` groups the fine-tuned labels into entities."""

import json

import pytest
import transformers
from transformers import pipeline

import tupe  # noqa: F401  (registers the Auto classes and the question-answering pipeline)
from tupe.cli import main
from tupe.finetuning.qa import read_squad
from tupe.pipelines import QuestionAnsweringPipeline, register_pipelines

SETTINGS = ("--max-seq-len", "48", "--doc-stride", "12")


def _finetune(model, task, train, validation, out, *extra):
    """A one-run `tupe finetune --save-models` into `out` (once per module): (the saved model, results, rows)."""
    if not (out / "results.json").exists():
        args = ["finetune", "--task", task, "--model", str(model), "--train", str(train)]
        args += ["--validation", str(validation), "--out", str(out), "--lrs", "1e-3", "--seeds", "1"]
        args += [
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--threads",
            "1",
            "--no-progress",
            "--save-models",
            *extra,
        ]
        assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return out / "runs" / results["best_run"] / "model", results, rows


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Where this module's runs go, as the docs name them: out/squad, out/squad2, out/ner."""
    return tmp_path_factory.mktemp("pipelines")


def _squad(tiny_model, data_dir, root, v2=False):
    files = ("squad2_train.json", "squad2_dev.json") if v2 else ("squad_train.json", "squad_dev.json")
    extra = [*SETTINGS, *(["--version-2-with-negative"] if v2 else [])]
    out = root / "out" / ("squad2" if v2 else "squad")
    return _finetune(tiny_model, "qa", data_dir / files[0], data_dir / files[1], out, *extra)


def _ner(tiny_model, data_dir, root):
    train, dev = data_dir / "ner_train.conll", data_dir / "ner_valid.txt"
    return _finetune(tiny_model, "ner", train, dev, root / "out" / "ner", "--lrs", "3e-3")


@pytest.mark.slow
@pytest.mark.parametrize("v2", [False, True])
def test_qa_pipeline_gives_the_answers_of_tupe_finetune(tiny_model, data_dir, root, v2):
    model, results, rows = _squad(tiny_model, data_dir, root, v2)
    files = ("squad2_train.json", "squad2_dev.json") if v2 else ("squad_train.json", "squad_dev.json")
    assert results["data"]["validation_features"] > results["data"]["validation_examples"]  # several windows
    questions = read_squad(data_dir / files[1], with_negative=v2)

    qa = pipeline("question-answering", model=str(model), device="cpu", max_seq_len=48, doc_stride=12)
    assert type(qa) is QuestionAnsweringPipeline and type(qa.model).__name__ == "TupeForQuestionAnswering"
    assert qa.tokenizer.is_fast
    got = qa(
        question=[q.question for q in questions],
        context=[q.context for q in questions],
        handle_impossible_answer=v2,
    )
    assert len(got) == len(questions) == len(rows)
    for q, row, answer in zip(questions, rows, got):
        assert row["id"] == q.id
        assert set(answer) == {"score", "start", "end", "answer"} and 0.0 <= answer["score"] <= 1.0
        assert answer["answer"] == row["prediction"], q.id
        assert q.context[answer["start"] : answer["end"]] == answer["answer"]
    one = qa(question=questions[0].question, context=questions[0].context, handle_impossible_answer=v2)
    assert one == got[0]  # one question: one dict, the same as in the list
    if (
        v2
    ):  # the empty answers are the null answer outscoring spans that exist: without it, spans are answered
        got = qa(question=[q.question for q in questions], context=[q.context for q in questions])
    assert any(a["answer"] for a in got)


@pytest.mark.slow
def test_qa_pipeline_top_k_and_long_contexts_split_across_windows(tiny_model, data_dir, root):
    model, _, _ = _squad(tiny_model, data_dir, root)
    q = read_squad(data_dir / "squad_dev.json", with_negative=False)[0]
    context = " ".join([q.context] * 4)  # far longer than one 48-token window
    qa = pipeline("question-answering", model=str(model), device="cpu")
    windows = list(qa.preprocess({"question": q.question, "context": context}, max_seq_len=48, doc_stride=12))
    assert len(windows) > 5 and windows[-1]["is_last"] and not windows[0]["is_last"]
    best = qa(question=q.question, context=context, top_k=5, max_seq_len=48, doc_stride=12)
    assert isinstance(best, list) and 1 <= len(best) <= 5
    assert [a["score"] for a in best] == sorted((a["score"] for a in best), reverse=True)
    assert len({(a["start"], a["end"]) for a in best}) == len(best)  # a span seen in two windows counts once
    assert all(context[a["start"] : a["end"]] == a["answer"] for a in best)
    # the same answer in batches of windows of several questions
    batched = qa(
        [{"question": q.question, "context": context}] * 3, max_seq_len=48, doc_stride=12, batch_size=4
    )
    assert batched == [best[0]] * 3
    with_null = qa(question=q.question, context=context, top_k=50, handle_impossible_answer=True)
    assert sum(a["answer"] == "" and a["start"] == a["end"] == 0 for a in with_null) == 1
    assert sum(a["score"] for a in with_null) <= 1.0 + 1e-9


def test_qa_pipeline_refusals(tiny_model, tmp_path):
    qa_dir = tmp_path / "qa"
    transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_model).save_pretrained(qa_dir)
    transformers.AutoTokenizer.from_pretrained(tiny_model).save_pretrained(qa_dir)
    qa = pipeline("question-answering", model=str(qa_dir), device="cpu")
    context = "The museum in Paris opened in 1931."
    with pytest.raises(ValueError, match="max_seq_len 128 exceeds the model's max_position_embeddings 64"):
        qa(question="When?", context=context, max_seq_len=128)
    with pytest.raises(ValueError, match="doc_stride 40 is larger than max_seq_len 32"):
        qa(question="When?", context=context, max_seq_len=32, doc_stride=40)
    # a stride above half the window, as transformers' pipeline allowed: answered (issue 38)
    answer = qa(question="When?", context=context * 4, max_seq_len=32, doc_stride=20)
    assert answer["answer"] and (context * 4)[answer["start"] : answer["end"]] == answer["answer"]
    with pytest.raises(ValueError, match="leaving .* to the context; that must be more than doc_stride 8"):
        qa(question="When " * 40 + "?", context=context, max_seq_len=48, doc_stride=8)
    with pytest.raises(ValueError, match="empty context"):
        qa(question="When?", context=" ")
    with pytest.raises(ValueError, match="2 questions but 3 contexts"):
        qa(question=["a?", "b?"], context=[context] * 3)
    with pytest.raises(
        ValueError, match="context must be a string or a non-empty list of strings, got int 42"
    ):
        qa(question="When?", context=42)  # issue 38: was TypeError: 'int' object is not iterable
    with pytest.raises(ValueError, match="question must be a string .* got list"):
        qa(question=["a?", 7], context=context)
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        qa(question="When?", context=context, top_k=0)
    with pytest.raises(TypeError, match="unknown setting.*max_question_len"):
        qa(question="When?", context=context, max_question_len=10)
    with pytest.raises(ValueError, match="needs a question-answering head.*got TupeForMaskedLM"):
        pipeline(
            "question-answering",
            model=transformers.AutoModelForMaskedLM.from_pretrained(tiny_model),
            tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_model),
            device="cpu",
        )


def test_the_library_s_own_question_answering_task_is_never_replaced(monkeypatch):
    registry = transformers.pipelines.PIPELINE_REGISTRY
    assert registry.supported_tasks["question-answering"]["impl"] is QuestionAnsweringPipeline
    assert "question-answering" not in transformers.pipelines.REMOVED_TASKS

    class LibraryPipeline:  # what a transformers version with the task of its own would have
        pass

    monkeypatch.setitem(registry.supported_tasks, "question-answering", {"impl": LibraryPipeline, "pt": ()})
    register_pipelines()
    assert registry.supported_tasks["question-answering"]["impl"] is LibraryPipeline


@pytest.mark.slow
def test_token_classification_pipeline_on_a_finetuned_ner_model(tiny_model, data_dir, root):
    model, results, _ = _ner(tiny_model, data_dir, root)
    ner = pipeline("token-classification", model=str(model), aggregation_strategy="simple", device="cpu")
    assert type(ner.model).__name__ == "TupeForTokenClassification"
    assert sorted(ner.model.config.id2label.values()) == results["label_names"]
    types = {t[2:] for t in results["label_names"] if t != "O"}
    text = "Alice Smith flew from Paris to Berlin with Bob ."
    entities = ner(text)
    assert entities, "the fine-tuned model should tag something in this sentence"
    for e in entities:
        assert e["entity_group"] in types and 0.0 <= e["score"] <= 1.0
        # exact spans: the tokenizer's offsets leave out the space before a word, and decoding the space
        # add_prefix_space adds (a token of a space alone, as this tiny vocabulary has, covers no text: empty)
        assert 0 <= e["start"] <= e["end"] <= len(text) and e["word"] == text[e["start"] : e["end"]]


@pytest.mark.slow
def test_the_docs_pipeline_example_runs(tiny_model, data_dir, root, monkeypatch, capsys):
    """docs/finetuning.md "Pipelines on the fine-tuned model", run as written on this module's out/squad, out/ner:
    what it prints and the checks it makes (whole-word entities, with the aggregation strategy the saved config
    names) are the pipelines' real output, not a comment (issue 38)."""
    import re
    from pathlib import Path

    _squad(tiny_model, data_dir, root)
    _ner(tiny_model, data_dir, root)
    doc = Path(__file__).resolve().parents[2] / "docs" / "finetuning.md"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S) if "pipeline(" in b]
    assert len(blocks) == 1
    monkeypatch.chdir(root)
    capsys.readouterr()  # what the fine-tuning runs printed
    exec(compile(blocks[0], str(doc), "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and printed[0].startswith("{'score': ")


def test_qa_pipeline_serves_any_extractive_model(tiny_model, tmp_path):
    """Registered for the task, not for tupe: a `transformers` BERT question-answering checkpoint works too."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    transformers.set_seed(0)
    transformers.BertForQuestionAnswering(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    qa = pipeline("question-answering", model=str(tmp_path), device="cpu")
    context = "The museum in Paris opened in 1931. " * 6  # several windows of the default 64 tokens
    answer = qa(question="When did it open?", context=context)
    assert type(qa.model).__name__ == "BertForQuestionAnswering"
    assert answer["answer"] and context[answer["start"] : answer["end"]] == answer["answer"]
