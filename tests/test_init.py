"""`recpipe init`: a starting config inferred from a log the project does not ship, and the guide's three
commands (docs/your-own-log.md) run as written on it."""
from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recpipe.features.config import load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.pipeline.infer import InferError, infer, profile_table, render_config

from helpers import REPO


def _shop_log(rows: int, seed: int = 0, day: dt.datetime = dt.datetime(2026, 3, 1)) -> pa.Table:
    """A purchase log with its own names and types: a millisecond timestamp, a boolean label, dictionary and
    list columns, float32 and int32 numbers, a column always null."""
    rng = np.random.default_rng(seed)
    shopper = rng.zipf(1.6, rows) % 400
    sku = rng.integers(0, 300, rows)
    bought = rng.random(rows) < 1 / (1 + np.exp(-(((shopper + sku) % 7) - 4.0)))
    return pa.table({
        "event_time": pa.array([day + dt.timedelta(seconds=int(s)) for s in np.sort(rng.integers(0, 86_400, rows))],
                               pa.timestamp("ms")),
        "shopper": pa.array([f"s{int(x)}" for x in shopper]),
        "sku_id": pa.array(sku, pa.int64()),
        "brand": pa.array(rng.choice(["acme", "globex", "initech", None], rows)).dictionary_encode(),
        "tags": pa.array([list(rng.choice(["new", "sale", "eco", "gift"], rng.integers(0, 3))) for _ in range(rows)],
                         pa.list_(pa.string())),
        "price": pa.array(rng.lognormal(3, 1.5, rows), pa.float32()),
        "qty": pa.array(rng.integers(1, 5, rows), pa.int32()),
        "visits": pa.array(rng.poisson(3, rows) * rng.integers(1, 400, rows), pa.int64()),
        "bought": pa.array(bought),
        "note": pa.array([None] * rows, pa.string()),
    })


def _write_days(root: Path, days: int, rows: int) -> Path:
    for d in range(days):
        day = dt.datetime(2026, 3, 1) + dt.timedelta(days=d)
        (root / f"dt={day.date()}").mkdir(parents=True)
        pq.write_table(_shop_log(rows, seed=d, day=day), root / f"dt={day.date()}" / "part-0.parquet")
    return root


@pytest.mark.unit
def test_init_guesses_each_column_from_its_figures(tmp_path):
    table = _shop_log(3000)
    inference = infer(profile_table(table), table.num_rows)
    roles = {g.column: g.role for g in inference.guesses}
    assert roles == {"event_time": "timestamp", "bought": "label", "shopper": "sparse", "sku_id": "sparse",
                     "brand": "sparse", "tags": "sparse", "qty": "sparse", "price": "dense", "visits": "dense",
                     "note": "skip"}
    cfg = inference.typed()
    assert cfg.input.timestamp == "event_time" and cfg.label.column == "bought"
    sparse = {f.name: f for f in cfg.features.sparse}
    assert sparse["tags"].multivalent and sparse["shopper"].vocab is not None
    assert {d.name: d.transform for d in cfg.features.dense} == {"price": "log_zscore", "visits": "zscore"}
    assert [g.column for g in inference.checks()] == ["qty"]  # few integer values: category or number?
    path = tmp_path / "cfg.yaml"
    path.write_text(render_config(inference, "shop/"))
    assert load_config(path) == cfg
    text = path.read_text()
    assert "#   qty: integers with few values" in text and "positive rate" in text and "#   note:" in text


@pytest.mark.unit
def test_init_hashes_values_that_do_not_repeat_and_names_a_missing_label():
    rows = 5000
    table = pa.table({"session": pa.array([f"x{i}" for i in range(rows)]),
                      "click": pa.array(np.arange(rows) % 3 == 0).cast(pa.int8())})
    inference = infer(profile_table(table), rows)
    (session,) = inference.typed().features.sparse
    assert session.hash_buckets == 16_384 and session.vocab is None
    assert "input" not in inference.config  # no time column: split in file order, said in the YAML
    assert "No time column found" in render_config(inference, "x")
    with pytest.raises(InferError, match="no column holds only 0 and 1"):
        infer(profile_table(table.drop(["click"])), rows)
    with pytest.raises(InferError, match=r"--label 'session': the label must hold 0 and 1 only"):
        infer(profile_table(table), rows, label="session")


def _guide_commands() -> list[str]:
    text = (REPO / "docs" / "your-own-log.md").read_text()
    block = re.search(r"## The three commands\n+```bash\n(.*?)```", text, re.S).group(1)
    follow = re.search(r"Then `(recpipe evaluate [^`]+)`", text).group(1)
    return [line for line in block.splitlines() if line.strip()] + [follow]


@pytest.mark.system
def test_the_guides_commands_run_on_a_log_the_project_does_not_ship(tmp_path):
    """The guide's commands, as written, on a 3-day purchase log; only the training is cut to 30 steps."""
    _write_days(tmp_path / "logs", days=3, rows=1500)
    commands = _guide_commands()
    assert [shlex.split(c)[:2] for c in commands] == [["recpipe", "init"], ["recpipe", "preprocess"],
                                                      ["recpipe", "train"], ["recpipe", "evaluate"]]
    outputs = []
    for command in commands:
        args = shlex.split(command)[1:] + (["--steps", "30"] if command.startswith("recpipe train") else [])
        run = subprocess.run([sys.executable, "-m", "recpipe.cli", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, f"{command}:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
        outputs.append(run.stdout)
    assert "init:   bought      label" in outputs[0]
    metrics = json.loads(outputs[3].strip().splitlines()[-1])
    counts = PreprocessedData(str(tmp_path / "work" / "pre")).transform().row_counts
    assert counts["train"] + counts["validation"] + counts["eval"] + counts.get("dead_letter", 0) == 4500
    assert metrics["examples"] == counts["eval"] > 0 and np.isfinite(metrics["auc"])
