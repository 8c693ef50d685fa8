"""Model folders saved by tupe at e1cb602 (tests/modeling/fixtures/e1cb602: one per scheme, made by
make_e1cb602_folders.py with that commit's code, each saving one of its scheme's kernels under the old key
`attention_kernel`, one also the older `fold_positional`) load unchanged, and `config._attn_implementation`,
the one kernel setting, reads what runs after loading with each value of `attn_implementation`."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

from tupe import POSITION_SCHEMES, TupeForMaskedLM
from tupe.modeling.positional import SCHEMES

from .fixtures.make_e1cb602_folders import OLDEST, inputs

FOLDERS = pathlib.Path(__file__).parent / "fixtures" / "e1cb602"
KERNELS = ("eager", "sdpa", "fold", "fused", "flex")


def _named(kernel: str) -> str:
    """What `config._attn_implementation` reads for registry kernel `kernel`: transformers' own names for tupe's
    eager and sdpa kernels, the `tupe_` name of the others."""
    return kernel if kernel in ("eager", "sdpa") else f"tupe_{kernel}"


def _saved(scheme: str) -> dict:
    return json.loads((FOLDERS / scheme / "config.json").read_text())


def test_there_is_a_folder_of_every_scheme():
    assert sorted(p.name for p in FOLDERS.iterdir()) == sorted(POSITION_SCHEMES)
    assert "fold_positional" in _saved(OLDEST)
    assert {_saved(s)["attention_kernel"] for s in POSITION_SCHEMES} == {"auto", *KERNELS}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_a_folder_saved_by_e1cb602_loads_unchanged(scheme, tmp_path):
    """Same float64 logits as e1cb602 computed, and the setting names a kernel: the saved one, or for "auto" the
    one "auto" takes on CPU in eval mode (SDPA: no training, no dropout)."""
    saved = _saved(scheme)["attention_kernel"]
    model = TupeForMaskedLM.from_pretrained(FOLDERS / scheme).double().eval()
    expected_kernel = "sdpa" if saved == "auto" else saved
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the folders' logits were computed: float64 sums in one order
    try:
        with torch.no_grad():
            logits = model(*inputs()).logits
    finally:
        torch.set_num_threads(threads)
    assert model.config._attn_implementation == _named(expected_kernel)
    # float64 sums in one order: bit-equal on a CPU like the one that made the folders; a CPU of another vector
    # width (AVX2 against AVX-512) sums in another order and differs by about 1e-15. Any change of the maths
    # (a term, a scale, a float32 step) differs by 1e-7 or far more.
    torch.testing.assert_close(
        logits, load_file(FOLDERS / scheme / "expected.safetensors")["logits"], atol=1e-12, rtol=1e-12
    )
    # saved again: one key, the setting ("auto" stays "auto", a named kernel its name)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "attention_kernel" not in config and "fold_positional" not in config
    assert config["attn_implementation"] == ("auto" if saved == "auto" else _named(saved))
    again = TupeForMaskedLM.from_pretrained(tmp_path).double().eval()
    assert again.config._attn_implementation == model.config._attn_implementation


# each request -> the kernel that runs on CPU in eval mode (None: the saved setting, "auto" here)
REQUESTS = {
    None: "sdpa",
    "auto": "sdpa",
    "default": "sdpa",
    "eager": "eager",
    "sdpa": "sdpa",
    "flex_attention": "flex",
    "sdpa-fold": "fold",
    **{k: k for k in KERNELS},
    **{f"tupe_{k}": k for k in KERNELS},
}


@pytest.mark.parametrize("scheme", ["tupe-a", "alibi", "rope", "deberta"])
def test_attn_implementation_read_after_loading_with_each_value(scheme):
    folder = FOLDERS / "tupe-r" if scheme == "tupe-r" else FOLDERS / scheme
    saved = _saved(scheme)["attention_kernel"]
    applies = SCHEMES[scheme].kernels()
    for request, kernel in REQUESTS.items():
        if kernel not in applies:  # refused, with the reason and what applies
            with pytest.raises(ValueError, match=f"kernels for it: {', '.join(applies)}"):
                TupeForMaskedLM.from_pretrained(folder, attn_implementation=request)
            continue
        model = TupeForMaskedLM.from_pretrained(
            folder, **({} if request is None else {"attn_implementation": request})
        )
        if request is None and saved != "auto":
            kernel = saved
        assert model.config._attn_implementation == _named(kernel), request
        assert model.tupe.config._attn_implementation == _named(kernel)  # the encoder shares the setting


@pytest.mark.parametrize(
    "name", ["flash_attention_2", "kernels-community/flash-attn", "paged|sdpa", "tupe_auto", "fast"]
)
def test_an_unknown_attn_implementation_is_refused_in_one_line(name):
    with pytest.raises(ValueError) as err:
        TupeForMaskedLM.from_pretrained(FOLDERS / "tupe-r", attn_implementation=name)
    message = str(err.value)
    assert "\n" not in message and "http" not in message
    assert message.startswith(
        f'Specified `attn_implementation="{name}"` is not supported; valid: auto, tupe_eager'
    )
    model = TupeForMaskedLM.from_pretrained(FOLDERS / "tupe-r")
    with pytest.raises(ValueError, match="is not supported"):
        model.set_attn_implementation(name)
    with pytest.raises(ValueError, match="is not supported"):
        model.config._attn_implementation = name


def test_a_kernel_the_scheme_cannot_run_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="attn_implementation 'fold' needs a low-rank content-free term"):
        TupeForMaskedLM.from_pretrained(FOLDERS / "tupe-r", attn_implementation="fold")
    with pytest.raises(ValueError, match="attn_implementation 'flex' needs a content-free logit term"):
        TupeForMaskedLM.from_pretrained(FOLDERS / "bert-a", attn_implementation="flex_attention")
    model = TupeForMaskedLM.from_pretrained(FOLDERS / "rope")
    with pytest.raises(ValueError, match="kernels for it: auto, eager, sdpa, fused"):
        model.set_attn_implementation("tupe_fold")
    assert model.config._attn_implementation == "tupe_fused"  # unchanged: the saved kernel
