"""`tupe evaluate --lengths`: per-model refusal beyond a learned table, table extension that changes the table only,
results at a model's own lengths identical to a plain evaluation, one JSON entry and one plotted point per model
and length."""

from __future__ import annotations

import json

import pytest
import torch

from tupe.cli import main
from tupe.data.corpus import resolve_corpus
from tupe.evaluation.evaluate import Settings, evaluate, load_eval_model
from tupe.evaluation.lengths import at_length, evaluate_lengths, extend_table, plot_lengths, table_key
from tupe.modeling.positional import SCHEMES

from .conftest import save_bert, save_tupe

FAST = dict(bootstrap=50, pppl_tokens=0, progress=False)
QUIET = dict(log=lambda m: None)


def _naive_interpolate(table: torch.Tensor, rows: int) -> torch.Tensor:
    """Row 0 kept; new stream row j (1..rows-1) sits at old stream position 1 + (j-1)(T-2)/(rows-2), read off the
    straight line between the two trained rows around it."""
    out = [table[0].double()]
    t = table.shape[0]
    for j in range(1, rows):
        x = 1 + (j - 1) * (t - 2) / (rows - 2)
        lo = min(int(x), t - 2)
        w = x - lo
        out.append((1 - w) * table[lo].double() + w * table[lo + 1].double())
    return torch.stack(out)


def test_extend_table_against_naive_interpolation_and_longformer_copy():
    torch.manual_seed(0)
    table = torch.randn(9, 5)
    assert torch.allclose(
        extend_table(table, 20, "interpolate").double(), _naive_interpolate(table, 20), atol=1e-6
    )
    rep = extend_table(table, 20, "repeat")
    assert torch.equal(rep[0], table[0])
    for j in range(1, 20):
        assert torch.equal(rep[j], table[1 + (j - 1) % 8])  # stream rows 1..8 copied end to end
    assert torch.equal(extend_table(table, 9, "interpolate"), table)  # same size: the identity


@pytest.mark.parametrize("scheme", ["tupe-a", "bert-a", "tupe-r", "bert-a-d"])
@pytest.mark.parametrize("method", ["interpolate", "repeat"])
def test_extension_changes_only_the_position_table(tmp_path, tokenizer, scheme, method):
    m = load_eval_model(save_tupe(tmp_path / scheme, tokenizer, scheme, max_len=32))
    before = {k: v.clone() for k, v in m.model.state_dict().items()}
    longer, note = at_length(m, 80, method)
    after = longer.model.state_dict()
    key = table_key(m)
    assert key is not None and before.keys() == after.keys()
    assert [k for k in before if not torch.equal(before[k], after[k])] == [key]
    assert after[key].shape == (80, before[key].shape[1])
    assert torch.equal(after[key], extend_table(before[key], 80, method))
    assert (
        longer.max_length == 80
        and note == f"table {dict(interpolate='interpolated', repeat='repeated')[method]} from 32 rows"
    )
    assert all(
        torch.equal(v, m.model.state_dict()[k]) for k, v in before.items()
    )  # the original is untouched


def test_bert_folder_table_extends_the_same_way(tmp_path, text_file):
    m = load_eval_model(save_bert(tmp_path / "bert", max_len=32))
    assert table_key(m) == "bert.embeddings.position_embeddings.weight"
    assert at_length(m, 64, "none") == (None, "no positions beyond 32 (--extend-positions extends the table)")
    longer, _ = at_length(m, 64, "interpolate")
    before, after = m.model.state_dict(), longer.model.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])] == [table_key(m)]
    r = evaluate_lengths(
        [m], resolve_corpus([str(text_file)]), [64], Settings(**FAST), "interpolate", **QUIET
    )
    assert r["by_length"][0]["evaluated"] and r["by_length"][0]["extended"] == "interpolate"


def test_beyond_the_table_is_a_per_model_message_and_rope_runs_on(tmp_path, tokenizer, text_file):
    a = load_eval_model(save_tupe(tmp_path / "a", tokenizer, "tupe-a", max_len=32))
    rope = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=32))
    assert table_key(rope) is None
    r = evaluate_lengths([a, rope], resolve_corpus([str(text_file)]), [32, 64], Settings(**FAST), **QUIET)
    entries = {(e["model"], e["length"]): e for e in r["by_length"]}
    assert len(r["by_length"]) == 4 and len(entries) == 4
    skipped = entries[(a.name, 64)]
    assert not skipped["evaluated"] and skipped["note"].startswith("no positions beyond 32")
    assert "loss" not in skipped
    assert entries[(rope.name, 64)]["evaluated"] and entries[(rope.name, 64)]["loss"]["value"] > 0
    assert entries[(rope.name, 64)]["first_minus_model"] is None  # the first model has no value at 64
    assert entries[(rope.name, 32)]["first_minus_model"] is not None


def test_lengths_at_or_below_the_models_own_equal_a_plain_evaluation(tmp_path, tokenizer, text_file):
    paths = [
        save_tupe(tmp_path / s, tokenizer, s, seed=i, max_len=32) for i, s in enumerate(["bert-a", "tupe-a"])
    ]
    models = [load_eval_model(p) for p in paths]
    corpus = resolve_corpus([str(text_file)])
    r = evaluate_lengths(models, corpus, [16, 32], Settings(**FAST), "interpolate", **QUIET)
    for length in (16, 32):
        plain = evaluate(models, corpus, Settings(**FAST, max_length=length), **QUIET)
        by_name = {m["name"]: m for m in plain["models"]}
        diff = plain["tokenizer_groups"][0]["differences"][0]
        for e in (e for e in r["by_length"] if e["length"] == length):
            assert e["extended"] is None and e["note"] is None
            assert e["loss"] == by_name[e["model"]]["loss"]
            assert e["word_order_delta"] == by_name[e["model"]]["word_order_delta"]
            if e["model"] == diff["b"]:
                assert e["first_minus_model"] == diff["loss"]


def test_rows_beyond_the_training_length_are_flagged_or_rebuilt(tmp_path, tokenizer):
    m = load_eval_model(save_tupe(tmp_path / "a", tokenizer, "tupe-a", max_len=32))
    m.train_length = (
        16  # as read from tupe_run.json for a run with --max-position-embeddings 32 --max-seq-len 16
    )
    same, note = at_length(m, 32, "none")
    assert same is m and note == "table rows 16-31 never trained (training length 16)"
    rebuilt, note = at_length(m, 32, "interpolate")
    table = table_key(m)
    assert torch.equal(
        rebuilt.model.state_dict()[table], extend_table(m.model.state_dict()[table][:16], 32, "interpolate")
    )
    assert at_length(m, 16, "interpolate") == (m, None)


def test_cli_lengths_table_json_and_plot(tmp_path, tokenizer, text_file, capsys, monkeypatch):
    a = save_tupe(tmp_path / "a", tokenizer, "bert-a", seed=1, max_len=32)
    rope = save_tupe(tmp_path / "rope", tokenizer, "rope", seed=2, max_len=32)
    out_json = tmp_path / "out" / "len.json"
    drawn: list[tuple[str, list[int]]] = []
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot

    def spy(self, xs, ys=None, *args, **kw):  # noqa: ANN001, ANN002, ANN003
        if kw.get("marker") == "o":
            drawn.append((kw["label"], list(xs)))
        return real_plot(self, xs, ys, *args, **kw) if ys is not None else real_plot(self, xs, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    capsys.readouterr()
    rc = main(
        ["evaluate", "--model", str(a), str(rope), "--text", str(text_file), "--lengths", "16,32,64",
         "--bootstrap", "50", "--max-blocks", "6", "--threads", "1", "--no-progress", "--json", str(out_json)]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    result = json.loads(out_json.read_text())
    assert "--lengths 16,32,64" in result["command"] and result["settings"]["extend_positions"] == "none"
    assert [(e["model"], e["length"]) for e in result["by_length"]] == [
        (str(a), 16), (str(rope), 16), (str(a), 32), (str(rope), 32), (str(a), 64), (str(rope), 64)
    ]  # fmt: skip
    assert (tmp_path / "out" / "len.png").stat().st_size > 0 and result["plot"].endswith("len.png")
    assert drawn == [("a", [16, 32]), ("rope", [16, 32, 64])]  # one point per model and evaluated length
    row = next(line for line in out.splitlines() if line.startswith(f"{a} ") and " 64 " in line)
    assert "no positions beyond 32" in row
    for e in result["by_length"]:
        if e["evaluated"]:
            row = next(
                line
                for line in out.splitlines()
                if line.startswith(f"{e['model']} ") and f" {e['length']} " in line
            )
            assert f"{e['loss']['value']:.3f} [{e['loss']['low']:.3f}, {e['loss']['high']:.3f}]" in row


def test_cli_lengths_option_errors(tmp_path, tokenizer, text_file, capsys):
    a = save_tupe(tmp_path / "a", tokenizer, "tupe-a", max_len=32)
    base = ["evaluate", "--model", str(a), "--text", str(text_file), "--quiet"]
    for extra, needle in (
        (["--lengths", "16,1"], "--lengths"),
        (["--lengths", "16", "--max-seq-len", "16"], "--max-seq-len and --lengths"),
        (["--plot", str(tmp_path / "p.png")], "--plot goes with --lengths"),
        (["--lengths", "64"], "nothing to evaluate at --lengths 64: "),
    ):
        capsys.readouterr()
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err


def test_plot_draws_every_model(tmp_path, tokenizer, text_file):
    m = load_eval_model(save_tupe(tmp_path / "a", tokenizer, "tupe-a", max_len=32))
    r = evaluate_lengths([m], resolve_corpus([str(text_file)]), [16, 32], Settings(**FAST), **QUIET)
    assert plot_lengths(r, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("scheme", ["tupe-a", "tupe-r"])
def test_table_row_0_is_never_used_under_the_cls_reset_and_extension_keeps_it(tmp_path, tokenizer, scheme):
    """docs/evaluation.md: with the [CLS] reset, row 0 gets no gradient (it never reaches the output), and the
    extension methods leave it where it is instead of mixing it into stream positions."""
    assert SCHEMES[scheme].resets_cls
    m = load_eval_model(save_tupe(tmp_path / scheme, tokenizer, scheme, max_len=32))
    ids = torch.randint(5, len(tokenizer), (2, 32))
    ids[:, 0] = tokenizer.cls_token_id
    m.model.train()
    m.model(ids, labels=ids).loss.backward()
    grad = m.model.get_parameter(table_key(m)).grad
    assert grad[0].abs().max() == 0 and grad[1:].abs().max() > 0
    for method in ("interpolate", "repeat"):
        longer, _ = at_length(m, 70, method)
        assert torch.equal(longer.model.state_dict()[table_key(m)][0], m.model.state_dict()[table_key(m)][0])


@pytest.mark.parametrize(
    "scheme", sorted(__import__("tupe.modeling.positional", fromlist=["SCHEMES"]).SCHEMES)
)
def test_every_scheme_runs_at_twice_its_length_or_says_why(tmp_path, tokenizer, scheme):
    """Asked of the class: with a learned table, `none` refuses and `interpolate` runs; without one it runs."""
    m = load_eval_model(save_tupe(tmp_path / scheme, tokenizer, scheme, max_len=16))
    ids = torch.randint(5, len(tokenizer), (1, 32))
    ids[:, 0] = tokenizer.cls_token_id
    plain, note = at_length(m, 32, "none")
    if table_key(m) is not None:
        assert plain is None and note.startswith("no positions beyond 16")
    else:
        assert note is None and plain.max_length == 32
    longer, _ = at_length(m, 32, "interpolate")
    with torch.inference_mode():
        assert longer.model(ids).logits.shape == (1, 32, len(tokenizer))


def test_a_length_longer_than_the_text_is_a_note_and_the_other_lengths_go_on(tmp_path, tokenizer, text_file):
    rope = load_eval_model(save_tupe(tmp_path / "rope", tokenizer, "rope", max_len=32))
    r = evaluate_lengths([rope], resolve_corpus([str(text_file)]), [32, 100_000], Settings(**FAST), **QUIET)
    ok, too_long = r["by_length"]
    assert ok["evaluated"] and not too_long["evaluated"]
    assert too_long["note"] == "the text has no full block of 100000 tokens"
