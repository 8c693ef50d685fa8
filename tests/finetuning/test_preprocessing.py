"""Encoding as transformers' run_ner / run_qa do it: a word's label on its first sub-token and -100 on the rest;
SQuAD contexts cut into overlapping windows whose labels point at the answer only where the whole answer lies
inside; post-processing of start/end logits to text answers (n-best, --max-answer-length, v2.0's empty answer)."""

import numpy as np
import pytest

from tupe.finetuning.arguments import FinetuneSettings
from tupe.finetuning.ner import NerFamily, Sentence
from tupe.finetuning.qa import QaFamily, Question, read_squad


def test_ner_label_on_the_first_sub_token_only(tokenizer):
    ner = NerFamily(FinetuneSettings(task="ner", max_seq_len=64))
    ner.labels = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    s = Sentence(["Bartholomew", "visited", "Kathmandu", "."], ["B-PER", "O", "B-LOC", "O"], "x")
    ds, word_ids = ner.encode_eval(tokenizer, [s])
    labels = ds[0]["labels"]
    words = word_ids[0]
    assert words.count(0) > 1 and words.count(2) > 1  # the rare names are split into several sub-tokens
    for j, w in enumerate(words):
        first = w is not None and words.index(w) == j
        assert labels[j] == (ner.labels.index(s.tags[w]) if first else -100)
    assert sum(x != -100 for x in labels) == len(s.tokens)


def test_ner_label_all_tokens_as_run_ner(tokenizer):
    """--label-all-tokens: every sub-token carries its word's label, B-X as I-X after the first (run_ner's
    label_all_tokens); the saved config names the pipeline aggregation that matches each way of labelling."""
    ner = NerFamily(FinetuneSettings(task="ner", max_seq_len=64, label_all_tokens=True))
    ner.labels = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    s = Sentence(["Bartholomew", "visited", "Kathmandu", "."], ["B-PER", "O", "B-LOC", "O"], "x")
    ds, word_ids = ner.encode_eval(tokenizer, [s])
    labels, words = ds[0]["labels"], word_ids[0]
    assert words.count(0) > 1 and words.count(2) > 1
    for j, w in enumerate(words):
        if w is None:
            assert labels[j] == -100
            continue
        tag = s.tags[w] if words.index(w) == j else s.tags[w].replace("B-", "I-")
        assert labels[j] == ner.labels.index(tag), (j, w)
    assert ner.config_extras() == {"aggregation_strategy": "average"}
    assert NerFamily(FinetuneSettings(task="ner")).config_extras() == {"aggregation_strategy": "first"}
    # the flag changes what a run learns: in the fingerprint when set, absent (as before it existed) when not
    assert "label_all_tokens" not in FinetuneSettings(task="ner").fingerprint_fields()
    assert (
        FinetuneSettings(task="ner", label_all_tokens=True).fingerprint_fields()["label_all_tokens"] is True
    )


def test_ner_prediction_read_from_first_sub_token_and_cut_words_are_o(tokenizer):
    ner = NerFamily(FinetuneSettings(task="ner", max_seq_len=8))
    ner.labels = ["B-PER", "O"]
    s = Sentence(["Bartholomew", "saw", "a", "b", "c", "d", "e", "f", "g"], ["B-PER"] + ["O"] * 8, "x")
    ds, aux = ner.encode_eval(tokenizer, [s])
    words = aux[0]
    logits = np.zeros((1, len(words), 2))
    for j, w in enumerate(words):
        logits[0, j, 0 if w == 0 and words.index(w) == j else 1] = 1.0  # B-PER on the name's first piece only
        if w == 0 and words.index(w) != j:
            logits[0, j] = [0.0, 5.0]  # later pieces of the name say O: ignored

    class Out:
        predictions = logits

    scores, rows = ner.score(Out, aux, [s])
    kept = len({w for w in words if w is not None})
    assert kept < len(s.tokens)  # max_seq_len 8 cut the sentence
    assert rows[0]["predicted"] == ["B-PER"] + ["O"] * 8 and scores["f1"] == 100.0


def _qa(**kw):
    return QaFamily(FinetuneSettings(task="qa", max_seq_len=32, doc_stride=8, **kw).resolved(64, 32))


def test_qa_windows_label_the_answer_only_where_it_is_whole(tokenizer, data_dir):
    qa = _qa()
    questions = read_squad(data_dir / "squad_dev.json", with_negative=False)
    ds, aux = qa.encode_eval(tokenizer, questions)
    assert len(ds) > 3 * len(questions)  # long contexts: several windows per question
    inside = {i: 0 for i in range(len(questions))}
    partial = 0
    for f in range(len(ds)):
        q = questions[aux["example"][f]]
        offs = aux["offsets"][f]
        a, b = q.starts[0], q.starts[0] + len(q.answers[0])
        spans = [o for o in offs if o is not None]
        s, e = ds[f]["start_positions"], ds[f]["end_positions"]
        if spans[0][0] <= a and spans[-1][1] >= b:  # the whole answer is in this window
            assert 0 < s <= e and q.context[offs[s][0] : offs[e][1]].strip() == q.answers[0]
            inside[aux["example"][f]] += 1
        else:
            assert s == e == 0  # [CLS]: not here, or only part of it (split across windows)
            partial += spans[0][0] < b and spans[-1][1] > a
    assert all(n >= 1 for n in inside.values())
    assert partial >= 1, "the fixture should have an answer split across two windows"


def test_qa_postprocessing_best_span_n_best_and_max_length():
    qa = _qa(max_answer_length=3, n_best=2)
    context = "aa bb cc dd"
    q = Question("1", "q?", context, ["bb"], [3], "x")
    offs = [None, (0, 2), (3, 5), (6, 8), (9, 11)]
    aux = {"example": [0], "offsets": [offs]}
    start = np.array([[0.0, 1.0, 5.0, 0.0, 0.0]])
    end = np.array([[0.0, 0.0, 4.0, 0.0, 9.0]])
    # best start 2 (bb), best end 4 (dd): span bb..dd is 3 tokens long, allowed
    assert qa.answers(start, end, aux, [q]) == ["bb cc dd"]
    qa.settings.max_answer_length = 2  # now bb..dd is too long: the best allowed pair is bb..bb
    assert qa.answers(start, end, aux, [q]) == ["bb"]
    qa.settings.n_best = 1  # only the top start (bb) and top end (dd): none allowed -> empty
    assert qa.answers(start, end, aux, [q]) == [""]


def test_qa_v2_null_answer_across_windows():
    qa = _qa(version_2_with_negative=True)
    q = Question("1", "q?", "aa bb", [], [], "x")
    offs = [None, (0, 2), (3, 5)]
    aux = {"example": [0, 0], "offsets": [offs, offs]}
    start = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    end = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    # null score = the lowest [CLS] score over windows (0.0); best span 2 + 2 = 4 > 0 -> answer "aa"
    assert qa.answers(start, end, aux, [q]) == ["aa"]
    start[1, 0] = end[1, 0] = 3.0  # both windows now prefer [CLS] (6 > 4)
    assert qa.answers(start, end, aux, [q]) == [""]


def test_doc_stride_checked():
    from tupe.errors import TupeError

    with pytest.raises(TupeError, match="--doc-stride 40 is larger than --max-seq-len 32"):
        FinetuneSettings(task="qa", max_seq_len=32, doc_stride=40).resolved(64, 32)
    # transformers' QA pipeline allowed a stride up to the window (issue 38): half of it or more is accepted here
    # too; whether the context keeps more than the stride is checked per question when the windows are cut
    assert FinetuneSettings(task="qa", max_seq_len=32, doc_stride=20).resolved(64, 32).doc_stride == 20
    with pytest.raises(TupeError, match="--max-seq-len 128 exceeds the model's max_position_embeddings 64"):
        FinetuneSettings(task="ner", max_seq_len=128).resolved(64, 32)


def test_rank_answers_spans_across_windows_offsets_and_probabilities():
    from tupe.finetuning.qa import rank_answers

    context = "aa bb cc"
    # offsets are words' exact spans (tupe's tokenizers trim the space before a word): "bb" is (3, 5); the answer
    # is the context between its tokens' offsets, nothing stripped
    offs = [None, (0, 2), (3, 5), (6, 8)]
    w1 = (np.array([0.0, 1.0, 4.0, 0.0]), np.array([0.0, 0.0, 3.0, 1.0]), offs)
    w2 = (np.array([0.0, 0.0, 2.0, 0.0]), np.array([0.0, 0.0, 3.5, 0.0]), offs)  # " bb" again, lower
    ranked = rank_answers([w1, w2], context, n_best=3, max_answer_length=5, with_null=False)
    assert ranked[0].text == "bb" and context[ranked[0].start : ranked[0].end] == "bb"
    assert ranked[0].logit == 7.0  # the best of the two windows' scores for the same span
    assert len({(a.start, a.end) for a in ranked}) == len(ranked)  # each span once
    assert all(context[a.start : a.end] == a.text for a in ranked)
    assert [a.logit for a in ranked] == sorted((a.logit for a in ranked), reverse=True)
    assert sum(a.probability for a in ranked) == pytest.approx(1.0)
    with_null = rank_answers([w1, w2], context, n_best=1, max_answer_length=5, with_null=True)
    assert [(a.text, a.start, a.end) for a in with_null] == [("bb", 3, 5), ("", 0, 0)]
    assert with_null[1].logit == 0.0  # the lowest [CLS] score over the windows
    assert rank_answers([w1], context, n_best=3, max_answer_length=0, with_null=False) == []
    # a token of white space only covers no text once trimmed ((3, 3)): it neither starts nor ends an answer
    spaced = "aa  bb"
    w3 = (np.array([0.0, 0.0, 9.0, 1.0]), np.array([0.0, 0.0, 9.0, 1.0]), [None, (0, 2), (3, 3), (4, 6)])
    assert [(a.text, a.start) for a in rank_answers([w3], spaced, 3, 5, False)][0] == ("bb", 4)
