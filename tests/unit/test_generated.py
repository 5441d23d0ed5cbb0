"""The committed JSON Schema / AsyncAPI files must match the models (`make schemas`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from powerguard.schemas import registry
from powerguard.schemas.export import kv_values, render_all

GENERATED = Path(__file__).resolve().parents[2] / "schemas" / "generated"


def test_generated_files_are_current():
    expected = render_all()
    stale = [
        name
        for name, text in expected.items()
        if not (GENERATED / name).exists() or (GENERATED / name).read_text() != text
    ]
    extra = sorted(p.name for p in GENERATED.iterdir() if p.name not in expected)
    assert not stale and not extra, (
        f"schemas/generated is stale (run `make schemas`): changed {stale}, obsolete {extra}"
    )


def test_one_schema_per_type_and_an_asyncapi_document():
    files = render_all()
    assert len([n for n in files if n.endswith(".schema.json")]) == len(registry()) + len(kv_values())
    status = json.loads(files["kv_saga_status_v1.schema.json"])  # the published status: by its schema alone
    assert {"schema", "saga", "state", "acks_received", "deadline", "history"} <= set(status["properties"])
    doc = yaml.safe_load(files["asyncapi.yaml"])
    assert doc["asyncapi"] == "3.0.0"
    assert doc["channels"]["power"]["address"] == "pg.power.{site}.{ups}"
    assert set(doc["channels"]["power"]["parameters"]) == {"site", "ups"}
    messages = doc["components"]["messages"]
    assert {m["name"] for m in messages.values()} == set(registry())
    # every $ref in the document resolves inside it
    text = json.dumps(doc)
    for ref in {r.split('"')[0] for r in text.split('"$ref": "')[1:]}:
        node = doc
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
    schema = json.loads(files["power_v1_on_battery.schema.json"])
    assert schema["properties"]["type"]["const"] == "io.powerguard.power.v1.on_battery"
