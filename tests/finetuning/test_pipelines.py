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


LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _classifier(tokenizer, config_class=None):  # noqa: ANN001, ANN202
    """A tiny token-classification model of LABELS (its own predictions are replaced by the tests)."""
    from tupe import TupeConfig, TupeForTokenClassification

    config = TupeConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, position_scheme="tupe-a", pad_token_id=0,
        cls_token_id=1, sep_token_id=2, id2label=dict(enumerate(LABELS)),
        label2id={t: i for i, t in enumerate(LABELS)},
    )  # fmt: skip
    return TupeForTokenClassification(config).eval()


def _entities(ner, text, tags, strategy, first_only=True):  # noqa: ANN001, ANN202
    """The pipeline's entities for `text` when the model predicts `tags` ({word of the text: tag}, "O" elsewhere)
    on each word's first token, as `tupe finetune` labels them (its other tokens predict a clashing "B-LOC"), or
    on every token of the word (`first_only=False`, as --label-all-tokens labels them)."""
    import torch
    from transformers.pipelines.token_classification import AggregationStrategy

    (inputs,) = ner.preprocess(text, **ner._preprocess_params)
    out = ner._forward(dict(inputs))
    offsets, words = inputs["offset_mapping"][0].tolist(), inputs["word_ids"]
    spans: dict[int, list[int]] = {}
    for (a, b), w in zip(offsets, words):
        if w is not None and b > a:
            spans[w] = [min(spans.get(w, [a])[0], a), max(spans.get(w, [b, b])[1], b)]
    logits = torch.full(out["logits"].shape, -4.0)
    previous = None
    for j, w in enumerate(words):
        tag = tags.get(text[slice(*spans[w])], "O") if w is not None and w in spans else "O"
        if w is not None and w == previous and first_only:
            tag = "B-LOC" if tag == "O" else "O"
        logits[0, j, LABELS.index(tag)] = 4.0
        previous = w
    out["logits"] = logits
    got = ner.postprocess([out], aggregation_strategy=AggregationStrategy[strategy.upper()])
    return [(e.get("entity_group", e.get("entity")), e["word"], e["start"], e["end"]) for e in got]


def test_token_classification_gives_whole_words_with_punctuation_apart_and_at_position_0(tokenizer):
    """Issue 38: on tupe's byte-level BPE a rare first letter makes a word start with a token of its space alone
    ("Ġ", "A", "l", ...), which covers no text once offsets are exact; transformers' word guess (a space next to a
    token) made it an entity of its own with an empty `word`, and joined "Paris," into one word. The pipeline
    `import tupe` registers reads the words from the tokenizer: whole words, at position 0 too, punctuation apart,
    `word == text[start:end]`."""
    from tupe.pipelines import TokenClassificationPipeline

    text = "Alice Smith flew from Paris, then (Berlin)."
    assert tokenizer.tokenize(text)[:2] == ["\u0120", "A"]  # the case: a lone space token first
    ner = pipeline("token-classification", model=_classifier(tokenizer), tokenizer=tokenizer, device="cpu")
    assert type(ner) is TokenClassificationPipeline and ner.reads_words
    tags = {"Alice": "B-PER", "Smith": "I-PER", "Paris": "B-LOC", "Berlin": "B-LOC"}
    want = [("PER", "Alice Smith", 0, 11), ("LOC", "Paris", 22, 27), ("LOC", "Berlin", 35, 41)]
    assert _entities(ner, text, tags, "first") == want
    assert _entities(ner, text, tags, "average", first_only=False) == want
    assert _entities(ner, text, tags, "max", first_only=False) == want
    # token by token, the lone space tokens are left out: every entity covers text, its own
    for strategy in ("simple", "none"):
        got = _entities(ner, text, {w: "B-LOC" for w in text.replace(",", " ").split()}, strategy)
        assert got and all(w and w == text[a:b] for _, w, a, b in got)
    # a run of spaces is a word of white space: no entity, and none of its space inside a word either
    text = "Alice  Smith met Bob."
    got = _entities(ner, text, {"Alice": "B-PER", "Smith": "I-PER", "Bob": "B-PER"}, "first")
    assert got == [("PER", "Alice  Smith", 0, 12), ("PER", "Bob", 17, 20)]


def test_token_classification_is_the_library_s_for_other_tokenizers(tmp_path):
    """A model whose tokenizer has a continuing-subword prefix (BERT's WordPiece) gets the library's pipeline
    result unchanged, and the task keeps the library's models and default."""
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForTokenClassification, PreTrainedTokenizerFast
    from transformers.pipelines import token_classification

    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "alice",
        "smith",
        "flew",
        "to",
        "par",
        "##is",
        ".",
        ",",
    ]
    backend = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    transformers.set_seed(0)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        id2label=dict(enumerate(LABELS)), label2id={t: i for i, t in enumerate(LABELS)},
    )  # fmt: skip
    model = BertForTokenClassification(config).eval()
    entry = transformers.pipelines.PIPELINE_REGISTRY.supported_tasks["token-classification"]
    assert entry["pt"] == (transformers.AutoModelForTokenClassification,) and "default" in entry
    ours = pipeline("token-classification", model=model, tokenizer=tok, device="cpu")
    assert not ours.reads_words
    library = token_classification.TokenClassificationPipeline(model=model, tokenizer=tok, device="cpu")
    text = "alice smith flew to paris, alice."
    for strategy in ("none", "simple", "first", "average", "max"):
        a, b = ours(text, aggregation_strategy=strategy), library(text, aggregation_strategy=strategy)
        assert [{**e, "score": round(float(e["score"]), 6)} for e in a] == [
            {**e, "score": round(float(e["score"]), 6)} for e in b
        ]
    assert np.isfinite([e["score"] for e in a]).all()


def test_pipelines_leave_the_user_s_tokenizer_as_it_was(tiny_model, tokenizer):
    """A tokenizer saved before tupe's offsets were exact (a bare template post-processor): the pipelines work on
    a copy with the trimming step; the object the user passed is not changed (it was, in place)."""
    import copy

    from tokenizers import processors

    old = copy.deepcopy(tokenizer)
    backend = old.backend_tokenizer
    assert type(backend.post_processor).__name__ == "Sequence"
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    before = old.backend_tokenizer.to_str()
    ner = pipeline(
        "token-classification", model=_classifier(old), tokenizer=old, aggregation_strategy="first"
    )
    assert ner.tokenizer is not old and ner("Alice met Bob.") is not None
    qa_model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_model)
    qa = pipeline("question-answering", model=qa_model, tokenizer=old, device="cpu")
    assert qa.tokenizer is not old
    answer = qa(question="Who?", context="Alice met Bob.")
    assert "Alice met Bob."[answer["start"] : answer["end"]] == answer["answer"]
    assert old.backend_tokenizer.to_str() == before
    # a tokenizer with exact spans already is used as it is
    assert (
        pipeline("token-classification", model=_classifier(tokenizer), tokenizer=tokenizer).tokenizer
        is tokenizer
    )
