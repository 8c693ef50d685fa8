"""Token classification, question answering and multiple choice (and the sentence head) against transformers'
`BertFor*` of the same weights, every head on every scheme, and the pipelines a BERT user runs."""

import pytest
import torch
import transformers
from transformers import AutoModelForQuestionAnswering, pipeline

import tupe
from tupe import (
    TupeForMaskedLM,
    TupeForMultipleChoice,
    TupeForQuestionAnswering,
    TupeForSequenceClassification,
    TupeForTokenClassification,
    TupeModel,
)

from ..helpers import random_bert, tiny_config, train_test_tokenizer

SCHEMES = list(tupe.POSITION_SCHEMES)
HEADS = [
    TupeForTokenClassification,
    TupeForQuestionAnswering,
    TupeForMultipleChoice,
    TupeForSequenceClassification,
]
VOCAB = 60


def _ids_and_mask(*shape):
    ids = torch.randint(1, VOCAB, shape)
    mask = torch.ones_like(ids)
    mask.view(-1, shape[-1])[1, shape[-1] - 4 :] = 0  # some padding
    return ids, mask


def _inputs_for(cls, batch=3, n=12, choices=3, num_labels=5):
    """Model inputs with labels for a head class (the same dict works for its BERT twin)."""
    if cls is TupeForMultipleChoice:
        ids, mask = _ids_and_mask(batch, choices, n)
        return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, choices, (batch,)))
    ids, mask = _ids_and_mask(batch, n)
    if cls is TupeForTokenClassification:
        labels = torch.randint(0, num_labels, (batch, n))
        labels[mask == 0] = -100
        labels[:, 0] = -100
        return dict(input_ids=ids, attention_mask=mask, labels=labels)
    if cls is TupeForQuestionAnswering:
        # one answer beyond the input (clamped and ignored, as BERT does)
        return dict(
            input_ids=ids,
            attention_mask=mask,
            start_positions=torch.tensor([2, 5, n + 7][:batch]),
            end_positions=torch.tensor([4, 5, n + 9][:batch]),
        )
    return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, num_labels, (batch,)))


def _num_labels(cls):
    return 2 if cls is TupeForQuestionAnswering else 5  # start and end


def _head_outputs(out):
    if hasattr(out, "start_logits"):
        return out.start_logits, out.end_logits
    return (out.logits,)


@pytest.mark.parametrize("cls", HEADS)
def test_from_bert_head_equals_transformers_bert_head(cls):
    bert = random_bert(cls._bert_class, num_labels=_num_labels(cls))
    model = cls.from_bert(bert).eval()
    assert model.config.position_scheme == "bert-a"
    assert model.config.num_labels == bert.config.num_labels
    assert model.config.id2label == bert.config.id2label
    inputs = _inputs_for(cls)
    expected, got = bert(**inputs), model(**inputs)
    keep = inputs["attention_mask"].bool()
    for e, g in zip(_head_outputs(expected), _head_outputs(got)):
        if cls in (TupeForTokenClassification, TupeForQuestionAnswering):
            e, g = e[keep], g[keep]  # padded positions differ (BERT gives them a token-type-free position)
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)


def test_from_bert_loads_a_path_and_keeps_the_label_names(tmp_path):
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    bert = random_bert(
        "BertForTokenClassification", id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    bert.save_pretrained(tmp_path)
    model = TupeForTokenClassification.from_bert(str(tmp_path)).eval()
    assert model.config.id2label == id2label and model.config.label2id == {"O": 0, "B-PER": 1, "I-PER": 2}
    ids = torch.randint(1, VOCAB, (2, 9))
    torch.testing.assert_close(model(ids).logits, bert(ids).logits, atol=1e-5, rtol=1e-5)


def test_from_bert_without_the_head_names_what_is_missing():
    with pytest.raises(ValueError, match="qa_outputs"):
        TupeForQuestionAnswering.from_bert(random_bert("BertForTokenClassification"))


def test_bare_encoder_from_bert_model():
    bert = random_bert("BertModel")
    model = TupeModel.from_bert(bert).eval()
    ids, mask = _ids_and_mask(3, 12)
    keep = mask.bool()
    torch.testing.assert_close(
        model(ids, attention_mask=mask).last_hidden_state[keep],
        bert(ids, attention_mask=mask).last_hidden_state[keep],
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize(
    "problem_type,num_labels",
    [("regression", 1), ("single_label_classification", 4), ("multi_label_classification", 4)],
)
def test_sequence_problem_types_equal_bert(problem_type, num_labels):
    bert = random_bert("BertForSequenceClassification", num_labels=num_labels, problem_type=problem_type)
    model = TupeForSequenceClassification.from_bert(bert).eval()
    ids, mask = _ids_and_mask(3, 10)
    labels = {
        "regression": torch.randn(3),
        "single_label_classification": torch.randint(0, num_labels, (3,)),
        "multi_label_classification": torch.randint(0, 2, (3, num_labels)).float(),
    }[problem_type]
    expected = bert(ids, attention_mask=mask, labels=labels)
    got = model(ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cls", HEADS)
def test_every_head_runs_on_every_scheme(scheme, cls):
    config = tiny_config(scheme, num_labels=_num_labels(cls), vocab_size=VOCAB, hidden_dropout_prob=0.1)
    model = cls(config).train()
    inputs = _inputs_for(cls, n=10)
    out = model(**inputs)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    head = [n for n, p in model.named_parameters() if not n.startswith("tupe.")]
    assert head and all(model.get_parameter(n).grad is not None for n in head)
    shapes = {
        TupeForTokenClassification: (3, 10, 5),
        TupeForMultipleChoice: (3, 3),
        TupeForSequenceClassification: (3, 5),
        TupeForQuestionAnswering: (3, 10),
    }
    assert all(t.shape == shapes[cls] for t in _head_outputs(out))
    as_tuple = model.eval()(**inputs, return_dict=False)
    as_output = model(**inputs)
    for t, e in zip(as_tuple, (as_output.loss, *_head_outputs(as_output))):
        torch.testing.assert_close(t, e)


def test_heads_load_from_a_pretrained_encoder_through_the_auto_classes(tmp_path):
    encoder = TupeForMaskedLM(tiny_config("tupe-r", vocab_size=VOCAB))
    encoder.save_pretrained(tmp_path)
    for auto, cls in (
        (transformers.AutoModelForTokenClassification, TupeForTokenClassification),
        (transformers.AutoModelForQuestionAnswering, TupeForQuestionAnswering),
        (transformers.AutoModelForMultipleChoice, TupeForMultipleChoice),
    ):
        model = auto.from_pretrained(tmp_path)
        assert type(model) is cls
        torch.testing.assert_close(model.tupe.state_dict(), encoder.tupe.state_dict(), atol=0, rtol=0)


@pytest.fixture(scope="module")
def tokenizer():
    lines = [
        "Alice Smith lives in Paris and works for Acme.",
        "Bob Jones visited London with Carol.",
        "The capital of France is Paris.",
        "Where does Alice live? She lives in Paris.",
    ] * 5
    tok = train_test_tokenizer(lines, vocab_size=300)
    tok.model_max_length = 40
    return tok


def test_token_classification_pipeline_groups_entities(tmp_path, tokenizer):
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    config = tiny_config(
        "tupe-a",
        vocab_size=len(tokenizer),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    model = TupeForTokenClassification(config).eval()
    with torch.no_grad():  # every token scores B-PER highest: one grouped PER entity per word run
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 5.0, 1.0, 0.0, 0.0]))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ner = pipeline("token-classification", model=str(tmp_path), aggregation_strategy="simple", device="cpu")
    assert type(ner.model) is TupeForTokenClassification
    text = "Alice Smith lives in Paris"
    entities = ner(text)
    assert entities and all(e["entity_group"] == "PER" for e in entities)
    # the fast tokenizer's offsets map every entity back onto the text
    assert all(text[e["start"] : e["end"]].strip() == e["word"].strip() for e in entities)
    assert entities[0]["start"] == 0


def _extract_answer(model, tokenizer, question: str, context: str) -> str:
    """What the question-answering pipeline does for one window: the best span inside the context, mapped back to
    the text through the fast tokenizer's offsets."""
    enc = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0]
    in_context = torch.tensor([s == 1 for s in enc.sequence_ids(0)])
    out = model(**enc)
    scores = out.start_logits[0][:, None] + out.end_logits[0][None, :]  # (start, end)
    allowed = in_context[:, None] & in_context[None, :] & torch.ones_like(scores, dtype=torch.bool).triu()
    best = int(scores.masked_fill(~allowed, float("-inf")).argmax())
    start, end = divmod(best, scores.shape[1])
    return context[int(offsets[start, 0]) : int(offsets[end, 1])]


def test_question_answering_on_a_saved_checkpoint_with_its_tokenizer(tmp_path, tokenizer):
    model = TupeForQuestionAnswering(tiny_config("tupe-r", vocab_size=len(tokenizer))).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert type(loaded) is TupeForQuestionAnswering
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tok.is_fast
    context = "Alice Smith lives in Paris and works for Acme."
    answer = _extract_answer(loaded, tok, "Where does Alice live?", context)
    assert answer and answer in context
    # transformers 5 removed this pipeline; `import tupe` registers one (tupe/pipelines.py) when it has none
    qa = pipeline("question-answering", model=str(tmp_path), device="cpu")
    result = qa(question="Where does Alice live?", context=context)
    assert context[result["start"] : result["end"]] == result["answer"] == answer.strip()
