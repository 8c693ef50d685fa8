"""The metrics on hand-made cases: entity-level scores counted by hand (and seqeval's own report), SQuAD exact
match and F1 with the official normalisation, computed by hand, v2.0's HasAns/NoAns split."""

import pytest

from tupe.finetuning.metrics import accuracy, entity_scores, normalize_answer, squad_scores, token_f1


def test_entities_counted_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-LOC"]]
    # gold entities: PER(0-1), LOC(3), ORG(s2 0); predicted: PER(0-1), ORG(3), ORG(s2 0), LOC(s2 1)
    # right: PER and the second sentence's ORG -> precision 2/4, recall 2/3
    s = entity_scores(gold, pred)
    assert s["precision"] == pytest.approx(50.0)
    assert s["recall"] == pytest.approx(200 / 3)
    assert s["f1"] == pytest.approx(100 * 2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert s["accuracy"] == pytest.approx(100 * 4 / 6)


def test_entity_boundaries_must_match_and_iob1_counts_like_iob2():
    assert entity_scores([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0  # a shorter span is wrong
    # IOB1: an entity may start with I-; the same span in IOB2 is the same entity
    assert entity_scores([["I-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O"]])["f1"] == 100.0
    # IOB1's B- separates two adjacent entities of one type
    assert entity_scores([["I-LOC", "B-LOC"]], [["I-LOC", "I-LOC"]])["recall"] == 0.0


def test_entities_agree_with_seqeval_report():
    from seqeval.metrics import classification_report

    gold = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-MISC"], ["B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "O"], ["B-ORG", "O", "O"]]
    report = classification_report(gold, pred, output_dict=True)
    s = entity_scores(gold, pred)
    assert s["f1"] == pytest.approx(100 * report["micro avg"]["f1-score"])
    assert s["precision"] == pytest.approx(100 * report["micro avg"]["precision"])


def test_all_o_scores_zero():
    s = entity_scores([["B-PER", "O"]], [["O", "O"]])
    assert s["f1"] == s["precision"] == s["recall"] == 0.0 and s["accuracy"] == 50.0


def test_squad_normalisation_by_hand():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear and THE plum.") == "apple pear and plum"
    assert token_f1("Eiffel tower in Paris", "the Eiffel tower") == pytest.approx(2 / 3)  # P 2/4, R 2/2
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("", "x") == 0.0


def test_squad_scores_best_over_answers():
    golds = [["in 1931", "1931"], ["Paris"], ["the river Seine"]]
    preds = ["1931.", "London", "Seine river"]
    s = squad_scores(golds, preds)
    assert s["exact_match"] == pytest.approx(100 / 3)  # "1931." normalises to the second answer
    assert s["f1"] == pytest.approx(100 * (1 + 0 + 1) / 3)  # {seine, river} vs {river, seine}: F1 1
    assert "HasAns_exact" not in s


def test_squad_v2_has_and_no_answers():
    golds = [["Paris"], [], []]
    preds = ["Paris", "", "Rome"]
    s = squad_scores(golds, preds)
    assert s["exact_match"] == pytest.approx(200 / 3)
    assert s["HasAns_exact"] == 100.0 and s["HasAns_total"] == 1
    assert s["NoAns_exact"] == 50.0 and s["NoAns_f1"] == 50.0 and s["NoAns_total"] == 2


def test_accuracy():
    assert accuracy([0, 1, 2, 3], [0, 1, 0, 0]) == {"accuracy": 50.0}
    with pytest.raises(ValueError):
        accuracy([0], [0, 1])
