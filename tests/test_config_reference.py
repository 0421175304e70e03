"""The config's reference and JSON Schema, generated from the config dataclasses: every key documented, the
shipped configs valid under the schema, and the committed docs/config.md and docs/config.schema.json what the
generator writes today."""
from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
import yaml

from recpipe.features import schema
from recpipe.features.config import load_config
from recpipe.features.schema_doc import field_docs, json_schema, reference_markdown

from helpers import REPO

pytestmark = pytest.mark.unit

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_every_key_has_a_meaning():
    missing = [f"{name}.{key}" for name in dir(schema) for cls in [getattr(schema, name)]
               if isinstance(cls, type) and dataclasses.is_dataclass(cls)
               for key, text in field_docs(cls).items() if not text]
    assert missing == []


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_are_valid_under_the_schema(path):
    jsonschema.Draft202012Validator(json_schema()).validate(yaml.safe_load(path.read_text()))
    load_config(path)


def test_the_schema_refuses_what_load_config_refuses():
    validator = jsonschema.Draft202012Validator(json_schema())
    good = yaml.safe_load((REPO / "configs" / "synthetic.yaml").read_text())
    for change, where in ((lambda d: d["features"]["sparse"][1]["vocab"].update(min_cout=3), "min_cout"),
                          (lambda d: d["model"].update(type="dcn_v3"), "dcn_v3"),
                          (lambda d: d["train"].update(steps="many"), "many"),
                          (lambda d: d.pop("name"), "name")):
        bad = json.loads(json.dumps(good))
        change(bad)
        errors = [e.message for e in validator.iter_errors(bad)]
        assert errors and any(where in m for m in errors), (where, errors)
    assert not list(validator.iter_errors({**good, "train": {**good["train"], "learning_rate": "1e-3"}}))


@pytest.mark.parametrize("name, generate", [("config.md", reference_markdown),
                                            ("config.schema.json", lambda: json.dumps(json_schema(), indent=2) + "\n")])
def test_the_committed_reference_is_generated(name, generate):
    """docs/ holds what `recpipe config reference` and `recpipe config schema` write: regenerate after a
    change to features/schema.py."""
    assert (REPO / "docs" / name).read_text() == generate(), \
        f"docs/{name} is stale: run recpipe config {'reference' if name.endswith('.md') else 'schema'} " \
        f"--output docs/{name}"
