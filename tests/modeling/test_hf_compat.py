"""transformers compatibility: BERT conversion oracle, Auto classes, save/load, remote code, heads, training."""

import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

import tupe
from tupe import TupeForMaskedLM, TupeForSequenceClassification, TupeModel

from ..helpers import random_bert, tiny_config

SCHEMES = list(tupe.POSITION_SCHEMES)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_from_bert_matches_transformers_bert(tmp_path, implementation):
    bert = random_bert()
    bert.save_pretrained(tmp_path)
    model = TupeForMaskedLM.from_bert(str(tmp_path)).eval()
    model.config._attn_implementation = implementation
    assert model.config.position_scheme == "bert-a"
    ids = torch.randint(1, 60, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 14:] = 0
    mask[2, 5:] = 0
    expected = bert(ids, attention_mask=mask, output_hidden_states=True)
    got = model(ids, attention_mask=mask, output_hidden_states=True)
    keep = mask.bool()
    for e, g in zip(expected.hidden_states, got.hidden_states):
        torch.testing.assert_close(g[keep], e[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.logits[keep], expected.logits[keep], atol=1e-4, rtol=1e-4)


def test_from_bert_accepts_an_instance_and_ties_the_decoder():
    model = TupeForMaskedLM.from_bert(random_bert())
    assert model.lm_head.decoder.weight.data_ptr() == model.tupe.embeddings.word_embeddings.weight.data_ptr()


def test_from_bert_carries_the_special_ids_of_a_google_layout_folder(tmp_path):
    """bert-base-uncased's layout ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103): the converted config
    takes the folder's own ids, saves them, and the same ids come from a tokenizer given with an instance."""
    from transformers import AutoTokenizer, BertForMaskedLM

    from ..helpers import google_bert_folder

    folder = google_bert_folder(tmp_path / "bert", ["the", "cat"])
    want = dict(pad_token_id=0, unk_token_id=100, cls_token_id=101, sep_token_id=102, mask_token_id=103)
    model = TupeForMaskedLM.from_bert(str(folder))
    assert {k: getattr(model.config, k) for k in want} == want
    model.save_pretrained(tmp_path / "tupe")
    assert {k: getattr(AutoConfig.from_pretrained(tmp_path / "tupe"), k) for k in want} == want
    bert = BertForMaskedLM.from_pretrained(folder)
    given = TupeModel.from_bert(bert, tokenizer=AutoTokenizer.from_pretrained(folder))
    assert {k: getattr(given.config, k) for k in want} == want
    # an instance alone: BERT's padding id, TupeConfig's defaults for the rest (nothing to read them from)
    assert (TupeModel.from_bert(bert).config.cls_token_id, TupeModel.from_bert(bert).config.pad_token_id) == (
        1,
        0,
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_save_pretrained_round_trip_through_auto_classes(tmp_path, scheme):
    model = TupeForMaskedLM(tiny_config(scheme)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).position_scheme == scheme
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is TupeForMaskedLM
    ids = torch.randint(5, 50, (2, 11))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    assert type(AutoModel.from_pretrained(tmp_path)) is TupeModel
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert type(classifier) is TupeForSequenceClassification
    torch.testing.assert_close(
        classifier.tupe.positional.state_dict(), loaded.tupe.positional.state_dict(), atol=0, rtol=0
    )


def test_checkpoint_loads_with_trust_remote_code_without_tupe_installed(tmp_path):
    model = TupeForMaskedLM(tiny_config("tupe-r")).eval()
    model.save_pretrained(tmp_path)
    ids = torch.randint(5, 50, (1, 9))
    expected = model(ids).logits
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.modules["tupe"] = None  # make `import tupe` impossible: only the checkpoint's own code may be used
        from transformers import AutoModelForMaskedLM
        model = AutoModelForMaskedLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        assert type(model).__module__ != "tupe.modeling.modeling_tupe", type(model).__module__
        ids = torch.load({str(tmp_path / "ids.pt")!r})
        torch.testing.assert_close(model(ids).logits, torch.load({str(tmp_path / "expected.pt")!r}))
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_sequence_classification_and_regression_losses():
    ids = torch.randint(5, 50, (4, 9))
    clf = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=3))
    labels = torch.tensor([0, 2, 1, 2])
    out = clf(ids, labels=labels)
    assert out.logits.shape == (4, 3)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    reg = TupeForSequenceClassification(tiny_config("tupe-a", num_labels=1))
    targets = torch.tensor([0.5, 4.0, 2.5, 1.0])
    out = reg(ids, labels=targets)
    assert out.logits.shape == (4, 1)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), targets))


def test_sparse_and_dense_prediction_give_the_same_loss():
    ids = torch.randint(5, 50, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7], labels[1, 8] = 11, 12, 13
    sparse = TupeForMaskedLM(tiny_config("tupe-a", sparse_prediction=True)).eval()
    dense = TupeForMaskedLM(tiny_config("tupe-a")).eval()  # the default: (batch, seq, vocab) logits
    dense.load_state_dict(sparse.state_dict())
    s, d = sparse(ids, labels=labels), dense(ids, labels=labels)
    assert s.logits.shape == (3, 50) and d.logits.shape == (2, 12, 50)
    torch.testing.assert_close(s.loss, d.loss)
    torch.testing.assert_close(s.logits, d.logits[labels != -100])


def test_return_dict_false_gives_transformers_style_tuples():
    model = TupeForMaskedLM(tiny_config("tupe-a")).eval()
    ids = torch.randint(5, 50, (2, 8))
    as_output = model(ids, labels=ids, output_hidden_states=True)
    as_tuple = model(ids, labels=ids, output_hidden_states=True, return_dict=False)
    assert len(as_tuple) == 3  # loss, logits, hidden states
    torch.testing.assert_close(as_tuple[0], as_output.loss)
    torch.testing.assert_close(as_tuple[1], as_output.logits)
    assert len(as_tuple[2]) == 3  # embeddings + 2 layers
    assert len(model(ids, return_dict=False)) == 1  # logits only


@pytest.mark.parametrize("head", ["TupeForMaskedLM", "TupeForSequenceClassification"])
def test_trainer_gradient_accumulation_gives_the_update_and_loss_of_one_batch(tmp_path, head):
    """transformers' Trainer, 2 accumulated batches of 2 against 1 batch of 4 (equal lengths, plain SGD, no
    clipping): the same weights and the same logged loss. The heads' losses are batch means and ignore
    `num_items_in_batch`, so the Trainer must be told (`accepts_loss_kwargs = False`) to divide them by the number
    of accumulated batches; a model whose `**kwargs` merely swallows it gets a sum: twice the loss and the step."""
    import datasets
    from transformers import Trainer, TrainingArguments

    generator = torch.Generator().manual_seed(0)
    features = []
    for k in range(4):
        ids = [1, *torch.randint(5, 50, (8,), generator=generator).tolist(), 2]
        labels = [-100] * len(ids)
        for i in (1, 4, 7):
            labels[i], ids[i] = ids[i], 3
        features.append({"input_ids": ids, "labels": labels if head == "TupeForMaskedLM" else k % 2})

    def collate(batch):
        return {key: torch.tensor([f[key] for f in batch]) for key in ("input_ids", "labels")}

    results = []
    for accumulate, size in ((1, 4), (2, 2)):
        torch.manual_seed(0)
        model = getattr(tupe, head)(tiny_config("tupe-r", num_labels=2))
        args = TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=size, gradient_accumulation_steps=accumulate,
            max_steps=1, learning_rate=0.1, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant",
            report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(features),
                          data_collator=collate)  # fmt: skip
        loss = trainer.train().training_loss
        results.append((loss, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (one_loss, one), (two_loss, two) = results
    assert two_loss == pytest.approx(one_loss, rel=1e-5)
    for key in one:
        torch.testing.assert_close(two[key], one[key], atol=1e-6, rtol=1e-5)
