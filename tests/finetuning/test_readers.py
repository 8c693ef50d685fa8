"""Readers of `tupe finetune`: CoNLL (-DOCSTART-, trailing blank lines, the tag in the last column wherever that
is), tokens/tags records, SQuAD v1.1/v2.0 JSON with its answer checks, SWAG CSV, classification files; every
problem is one line naming the file (and line or question)."""

import json

import pytest

from tupe.errors import TupeError
from tupe.finetuning.arguments import FinetuneSettings
from tupe.finetuning.choice import ChoiceFamily
from tupe.finetuning.classification import ClassificationFamily
from tupe.finetuning.ner import NerFamily, read_conll
from tupe.finetuning.qa import read_squad


def test_conll_docstart_trailing_blank_lines_and_four_columns(data_dir):
    sentences = read_conll(data_dir / "ner_train.conll")
    text = (data_dir / "ner_train.conll").read_text()
    assert text.endswith("\n\n\n") and text.count("-DOCSTART-") == 2
    assert len(sentences) == 48  # DOCSTART lines and the blank lines around them make no sentence
    first = sentences[0]
    lines = text.split("\n")
    assert lines[2].split() == [first.tokens[0], "NNP", "I-NP", first.tags[0]]  # token first, tag last (4th)
    assert first.where.endswith("ner_train.conll:3")
    assert all(len(s.tokens) == len(s.tags) for s in sentences)
    assert not any(t == "-DOCSTART-" for s in sentences for t in s.tokens)


def test_conll_tag_in_second_column_and_tabs(tmp_path):
    f = tmp_path / "two.txt"
    f.write_text("EU\tB-ORG\nrejects\tO\n\n\n-DOCSTART-\tO\n\nPeter B-PER\nBlackburn I-PER\n")
    s = read_conll(f)
    assert [x.tokens for x in s] == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert [x.tags for x in s] == [["B-ORG", "O"], ["B-PER", "I-PER"]]
    g = tmp_path / "three.txt"  # a tag column that is neither the second nor the fourth
    g.write_text("EU NNP B-ORG\nrejects VBZ O\n")
    assert read_conll(g)[0].tags == ["B-ORG", "O"]


@pytest.mark.parametrize("end", ["\r\n", "\r"])
def test_every_line_ending_reads_the_same(tmp_path, data_dir, end):
    """CR-only (old Mac) and CRLF files read as the "\n" file: same sentences, same line numbers, same records
    (issue 38: a CR-only CoNLL file was one sentence of one token, scored f1 100)."""
    text = (data_dir / "ner_train.conll").read_text()
    f = tmp_path / "ends.conll"
    f.write_bytes(text.replace("\n", end).encode())
    ours, reference = read_conll(f), read_conll(data_dir / "ner_train.conll")
    assert len(ours) == len(reference) == 48
    assert [(s.tokens, s.tags, s.line) for s in ours] == [(s.tokens, s.tags, s.line) for s in reference]
    records = tmp_path / "ends.jsonl"
    records.write_bytes(
        end.join(json.dumps({"tokens": ["a", "b"], "tags": ["O", "B-X"]}) for _ in range(3)).encode()
    )
    got = NerFamily(FinetuneSettings(task="ner")).read(records)
    assert [s.where.rsplit(":", 1)[1] for s in got] == ["1", "2", "3"]
    tsv = tmp_path / "ends.tsv"
    tsv.write_bytes(end.join(["text\tlabel", "good film\tpos", "bad film\tneg"]).encode())
    fam = ClassificationFamily(FinetuneSettings(task="classification"))
    assert [ex["text_a"] for ex in fam.read(tsv)] == ["good film", "bad film"]


def test_conll_errors(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(TupeError, match=r"bad\.txt:2: one column \('rejects'\)"):
        read_conll(f)
    f.write_text("EU NNP\n")
    with pytest.raises(TupeError, match=r"bad\.txt:1: tag 'NNP' is not an IOB tag"):
        read_conll(f)
    f.write_text("-DOCSTART- O\n\n\n")
    with pytest.raises(TupeError, match="no sentences"):
        read_conll(f)
    f.write_text("")
    with pytest.raises(TupeError, match=r"bad\.txt: empty file"):
        read_conll(f)


def test_tokens_and_tags_records(tmp_path):
    ner = NerFamily(FinetuneSettings(task="ner"))
    j = tmp_path / "a.jsonl"
    j.write_text(json.dumps({"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}) + "\n\n")
    assert ner.read(j)[0].tags == ["B-ORG", "O"]
    c = tmp_path / "a.csv"
    c.write_text('tokens,tags\nEU rejects,B-ORG O\n"[""New"", ""York""]","[""B-LOC"", ""I-LOC""]"\n')
    assert [s.tokens for s in ner.read(c)] == [["EU", "rejects"], ["New", "York"]]
    c.write_text("tokens,tags\nEU rejects,B-ORG\n")
    with pytest.raises(TupeError, match=r"a\.csv:2: 2 tokens but 1 tags"):
        ner.read(c)
    c.write_text("text,label\nhello,pos\n")
    with pytest.raises(TupeError, match=r"a\.csv:2: needs `tokens` and `tags` columns for NER"):
        ner.read(c)


def test_saved_dataset_with_class_label_tags(tmp_path):
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"])),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"tokens": [["Peter", "Blackburn", "ran"]], "ner_tags": [[1, 2, 0]]}, features=feats
    )
    ds.save_to_disk(str(tmp_path / "train"))
    s = NerFamily(FinetuneSettings(task="ner")).read(tmp_path / "train")
    assert s[0].tags == ["B-PER", "I-PER", "O"]
    datasets.DatasetDict(train=ds).save_to_disk(str(tmp_path / "both"))
    with pytest.raises(TupeError, match="a DatasetDict with splits train; give the split's own folder"):
        NerFamily(FinetuneSettings(task="ner")).read(tmp_path / "both")


def test_validation_tag_never_seen_in_training_is_named(tmp_path, data_dir):
    ner = NerFamily(FinetuneSettings(task="ner"))
    train = ner.read(data_dir / "ner_train.conll")
    f = tmp_path / "v.txt"
    f.write_text("Alice B-PER\n\nZurich B-GPE\n")
    with pytest.raises(TupeError, match=r"v\.txt:3: tag 'B-GPE' never occurs in the training file"):
        ner.check(train, ner.read(f), data_dir / "ner_train.conll", f)


def _squad(contexts):
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": contexts}]}


def test_squad_v1_and_v2(tmp_path, data_dir):
    v1 = read_squad(data_dir / "squad_dev.json", with_negative=False)
    assert len(v1) == 8 and all(q.answers for q in v1)
    q = v1[1]
    assert q.answers[1] == "in " + q.answers[0] and q.context[q.starts[0] :].startswith(q.answers[0])
    with pytest.raises(TupeError, match=r"question 'q301c' has no answer .*--version-2-with-negative"):
        read_squad(data_dir / "squad2_dev.json", with_negative=False)
    v2 = read_squad(data_dir / "squad2_dev.json", with_negative=True)
    assert [q.id for q in v2 if not q.answers] == ["q301c", "q303c"]


def test_squad_answer_not_at_its_start(tmp_path):
    f = tmp_path / "s.json"
    para = {
        "context": "The museum opened in 1931.",
        "qas": [{"id": "a1", "question": "When?", "answers": [{"text": "1931", "answer_start": 20}]}],
    }
    f.write_text(json.dumps(_squad([para])))
    with pytest.raises(
        TupeError,
        match=r"question 'a1': answer '1931' is not at its answer_start 20 \(the context there reads ' 193'\)",
    ):
        read_squad(f, with_negative=False)
    para["qas"][0]["answers"][0]["answer_start"] = 21
    f.write_text(json.dumps(_squad([para])))
    assert read_squad(f, with_negative=False)[0].starts == [21]
    para["qas"].append(dict(para["qas"][0]))
    f.write_text(json.dumps(_squad([para])))
    with pytest.raises(TupeError, match="question 'a1' appears twice"):
        read_squad(f, with_negative=False)


def test_squad_not_a_squad_file(tmp_path, data_dir):
    with pytest.raises(TupeError, match=r"not JSON .*official SQuAD JSON"):
        read_squad(data_dir / "ner_train.conll", with_negative=False)
    f = tmp_path / "x.json"
    f.write_text(json.dumps([{"tokens": ["a"], "tags": ["O"]}]))
    with pytest.raises(TupeError, match="not a SQuAD file"):
        read_squad(f, with_negative=False)


def test_swag_csv(tmp_path, data_dir):
    mc = ChoiceFamily(FinetuneSettings(task="multiple-choice"))
    ex = mc.read(data_dir / "swag_train.csv")
    assert len(ex) == 32 and all(len(e.endings) == 4 for e in ex)
    first = (data_dir / "swag_train.csv").read_text().split("\n")[1]
    assert ex[0].context == "the cat was, yes" and first.endswith(f",{ex[0].label}")
    f = tmp_path / "s.csv"
    f.write_text("sent1,sent2,ending0,ending1,label\nA,b,c,d,2\n")
    with pytest.raises(TupeError, match=r"s\.csv:2: label 2 is not an ending index \(0\.\.1\)"):
        mc.read(f)
    with pytest.raises(TupeError, match="needs SWAG columns"):
        mc.read(data_dir / "sentiment_train.csv")


def test_classification_label_set_from_training(tmp_path, data_dir):
    fam = ClassificationFamily(FinetuneSettings(task="classification"))
    train = fam.read(data_dir / "sentiment_train.csv")
    dev = fam.read(data_dir / "sentiment_val.csv")
    fam.check(train, dev, data_dir / "sentiment_train.csv", data_dir / "sentiment_val.csv")
    assert fam.label_names() == ["neg", "pos"] and train[0]["text_a"] == "the book was grim, I said"
    f = tmp_path / "v.csv"
    f.write_text("text,label\nok,pos\nmeh,neutral\n")
    with pytest.raises(TupeError, match=r"v\.csv:3: label 'neutral' never occurs in the training file"):
        fam.check(train, fam.read(f), data_dir / "sentiment_train.csv", f)
    with pytest.raises(TupeError, match="classification needs a `text`"):
        fam.read(data_dir / "swag_train.csv")
