"""The scheme interface: a config holds its own scheme's fields only (old `config.json` files, which carry every
scheme's fields, load unchanged), registering a scheme changes no other config, and a scheme of another
distribution (the `tupe.schemes` entry-point group) is saved and loaded by a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers.testing_utils import CaptureLogger

import tupe
from tupe import TupeConfig, TupeForMaskedLM
from tupe.modeling import configuration_tupe
from tupe.modeling.positional import SCHEMES, SchemeField, scheme_fields

from ..helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
# every built-in scheme's fields, with the values a config saved by tupe before this change carried whatever its
# scheme (`TupeConfig(max_position_embeddings=40)`: deberta's max_relative_positions resolved to 40)
EVERY_SCHEME_FIELD = {
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "rope_theta": 10000.0,
    "position_buckets": 256,
    "max_relative_positions": 40,
    "fire_mlp_width": 32,
    "fire_threshold": 512.0,
    "fire_normalizer": "length",
}


def test_a_config_holds_its_own_schemes_fields_only():
    for scheme, cls in SCHEMES.items():
        saved = TupeConfig(position_scheme=scheme).to_dict()
        own = {field.name for field in cls.config_fields}
        assert own <= saved.keys() and not (set(scheme_fields()) - own) & saved.keys(), scheme


@pytest.mark.parametrize("scheme", list(tupe.POSITION_SCHEMES))
def test_a_config_json_with_every_schemes_fields_loads(tmp_path, scheme):
    """A model folder as tupe saved it when every config carried every scheme's fields loads: the scheme's own
    values are kept, the others dropped, and the model computes what it computed."""
    model = TupeForMaskedLM(tiny_config(scheme, max_position_embeddings=40)).eval()
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    own = {field.name: config[field.name] for field in SCHEMES[scheme].config_fields}
    path.write_text(json.dumps({**config, **EVERY_SCHEME_FIELD, **own}))
    with CaptureLogger(configuration_tupe.logger) as said:
        loaded = TupeForMaskedLM.from_pretrained(tmp_path).eval()
    assert "does not read it" not in said.out  # the values every old file carries are dropped quietly
    assert {name: getattr(loaded.config, name) for name in own} == own
    assert not (EVERY_SCHEME_FIELD.keys() - own.keys()) & loaded.config.to_dict().keys()
    ids = torch.randint(5, 50, (2, 9))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_another_schemes_setting_given_a_value_is_dropped_with_a_warning():
    """A value of a field the scheme never reads (deberta's max_relative_positions for rope) is not silently lost:
    the warning names the field, the scheme that reads it and the config's scheme."""
    with CaptureLogger(configuration_tupe.logger) as said:
        config = tiny_config("rope", max_relative_positions=7)
    assert "max_relative_positions=7 is a setting of deberta" in said.out and "'rope'" in said.out
    assert "max_relative_positions" not in config.to_dict()
    with CaptureLogger(configuration_tupe.logger) as said:
        tiny_config(
            "rope", max_relative_positions=-1, rope_theta=500.0
        )  # deberta's default; rope's own field
    assert said.out == ""


def test_registering_a_scheme_changes_no_other_config():
    from tupe.modeling.positional import (
        PositionalContext,
        PositionalScheme,
        SchemeReport,
        register_scheme,
        unregister_scheme,
    )

    class Fielded(PositionalScheme):
        name = "toy-fielded"
        report = SchemeReport("Toy fielded", "a scheme with a field of its own")
        config_fields = (SchemeField("toy_width", 7, "a toy field"),)

        def forward(self, n, positions):
            return PositionalContext(self.logit_scale)

    before = {scheme: TupeConfig(position_scheme=scheme).to_dict() for scheme in SCHEMES}
    register_scheme(Fielded)
    try:
        after = {scheme: TupeConfig(position_scheme=scheme).to_dict() for scheme in before}
        assert after == before
        assert TupeConfig(position_scheme="toy-fielded").toy_width == 7
    finally:
        unregister_scheme("toy-fielded")


TOY_MODULE = """
import torch
from torch import nn

from tupe.modeling.positional import PositionalContext, PositionalScheme, SchemeField, SchemeReport


class DistanceBias(PositionalScheme):
    name = "toy-distance"
    report = SchemeReport("Toy distance", "a learned per-head slope times the clipped distance")
    terms = frozenset({"content_free"})
    config_fields = (SchemeField("toy_max_distance", 64, "distances beyond it count as it", int, 1, 1 << 20),)

    def __init__(self, config):
        super().__init__(config)
        self.max_distance = config.toy_max_distance
        self.slopes = nn.Parameter(torch.empty(config.num_attention_heads))

    def init_positional_weights(self, std):
        nn.init.normal_(self.slopes, mean=0.0, std=1.0)

    def forward(self, n, positions):
        i = torch.arange(n, device=self.slopes.device)[None] if positions is None else positions.ids
        distance = (i[:, None, :] - i[:, :, None]).abs().clamp(max=self.max_distance)
        slopes = -nn.functional.softplus(self.slopes)[None, :, None, None]
        return PositionalContext(self.logit_scale, content_free=(slopes * distance[:, None]).squeeze(0))
"""

SAVE = """
import torch
from tupe import TupeConfig, TupeForMaskedLM
config = TupeConfig(position_scheme="toy-distance", toy_max_distance=5, hidden_size=16, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=32, vocab_size=50, max_position_embeddings=40)
torch.manual_seed(0)
model = TupeForMaskedLM(config).eval()
model.save_pretrained(FOLDER)
ids = torch.randint(5, 50, (2, 9), generator=torch.Generator().manual_seed(1))
torch.save({"ids": ids, "logits": model(ids).logits}, FOLDER + "/expected.pt")
"""

LOAD = """
import sys
import torch
from tupe import TupeForMaskedLM
from tupe.io.model_folder import check_model_folder
assert "toy_scheme" not in sys.modules
check_model_folder(FOLDER)  # the folder check knows the scheme by its entry point
model = TupeForMaskedLM.from_pretrained(FOLDER).eval()
assert model.config.toy_max_distance == 5 and "relative_attention_num_buckets" not in model.config.to_dict()
want = torch.load(FOLDER + "/expected.pt")
torch.testing.assert_close(model(want["ids"]).logits, want["logits"], rtol=0, atol=0)
positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]] * 2)  # packed documents reach the scheme
model(want["ids"], position_ids=positions)
print("loaded", type(model.tupe.positional).__module__)
"""


def test_a_scheme_of_another_distribution_saves_and_loads_in_a_fresh_process(tmp_path):
    """An installed distribution declares its scheme in the `tupe.schemes` entry-point group; a process that
    never imported it saves a model of it, and another fresh one checks and loads the folder, finding the scheme
    by the name in config.json."""
    site = tmp_path / "site"
    (site / "toy_scheme-0.1.dist-info").mkdir(parents=True)
    (site / "toy_scheme.py").write_text(TOY_MODULE)
    (site / "toy_scheme-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy-scheme\nVersion: 0.1\n"
    )
    (site / "toy_scheme-0.1.dist-info" / "entry_points.txt").write_text(
        "[tupe.schemes]\ntoy-distance = toy_scheme:DistanceBias\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    folder = tmp_path / "model"
    for script in (SAVE, LOAD):
        code = f"FOLDER = {str(folder)!r}\n" + textwrap.dedent(script)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "loaded toy_scheme"
    assert json.loads((folder / "config.json").read_text())["position_scheme"] == "toy-distance"


def test_a_schemes_field_given_to_from_pretrained_is_taken_as_the_constructor_takes_it(tmp_path):
    """`from_pretrained(path, field=value)`: the checkpoint's own scheme's field is resolved and checked as in the
    constructor (deberta's -1 becomes the length, as stored); another scheme's is dropped with
    the constructor's warning, and the model loads (transformers would hand it to the model's __init__)."""
    TupeForMaskedLM(tiny_config("tupe-a", max_position_embeddings=40)).save_pretrained(tmp_path / "tupe-a")
    TupeForMaskedLM(tiny_config("deberta", max_position_embeddings=40)).save_pretrained(tmp_path / "deberta")
    with CaptureLogger(configuration_tupe.logger) as said:
        loaded = TupeForMaskedLM.from_pretrained(tmp_path / "tupe-a", rope_theta=500.0)
    assert "rope_theta=500.0 is a setting of rope" in said.out and "'tupe-a'" in said.out
    assert "rope_theta" not in loaded.config.to_dict()
    deberta = TupeForMaskedLM.from_pretrained(tmp_path / "deberta", max_relative_positions=-1)
    assert deberta.config.max_relative_positions == 40
    config, unused = TupeConfig.from_pretrained(tmp_path / "deberta", max_relative_positions=8, foo=1,
                                                return_unused_kwargs=True)  # fmt: skip
    assert config.max_relative_positions == 8 and unused == {"foo": 1}
