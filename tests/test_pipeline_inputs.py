"""Preprocessing on hostile input: values beyond float32, invalid UTF-8 and separators inside list items are
dead-lettered with their reason (or clipped, where the config says so); a truncated Parquet file and a
mistyped option fail naming the file or the option; staging and temp folders left by killed runs are
removed; the Criteo converter keeps unparsable rows for preprocess to dead-letter and sets aside lines with
the wrong number of fields."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import IN_MEMORY, small_config_dict
from recpipe.features.config import load_config, parse_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.pipeline.options import BeamOptionsError
from recpipe.pipeline.preprocess import run_preprocess
from recpipe.serving.export.savedmodel import export_model

from helpers import QUIET, config_file, day_table, run_cli, set_column, write_table


@pytest.mark.integration
def test_values_beyond_float32_are_dead_lettered_or_clipped(tmp_path, small_log, small_cfg):
    t = day_table(small_log)
    i2 = t.column("I2").to_pylist()
    i2[7] = 1e39  # finite in float64, inf in float32
    log = write_table(tmp_path / "log" / "p.parquet",
                      set_column(t, "I2", [float(v) if v is not None else None for v in i2], pa.float64()))
    res = run_preprocess(small_cfg, log, str(tmp_path / "dead"), IN_MEMORY, **QUIET)
    assert res.dead_letter == {"dense_out_of_range": 1}
    stats = PreprocessedData(str(tmp_path / "dead")).transform().dense_stats["I2"]
    assert math.isfinite(stats["mean"]) and math.isfinite(stats["std"])
    d = small_config_dict()
    d["features"]["dense"][1]["out_of_range"] = "clip"
    res = run_preprocess(parse_config(d), log, str(tmp_path / "clip"), IN_MEMORY, **QUIET)
    assert res.rows_dead == 0
    assert math.isfinite(PreprocessedData(str(tmp_path / "clip")).transform().dense_stats["I2"]["mean"])


@pytest.mark.integration
def test_a_truncated_file_with_its_footer_kept_names_the_file(tmp_path, small_log, small_cfg):
    src = tmp_path / "in" / "b.parquet"
    write_table(src, day_table(small_log, 3000).select(small_cfg.raw_columns()))
    data = src.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little") + 8  # the footer and the trailing magic bytes are kept
    first_data = pq.ParquetFile(src).metadata.row_group(0).column(0).data_page_offset
    src.write_bytes(data[:first_data + 200] + b"\0" * (len(data) - first_data - 200 - footer) + data[-footer:])
    pq.ParquetFile(src)  # the footer still reads: the damage shows only when the pages are read
    p = run_cli("preprocess", "--config", config_file(tmp_path), "--input", str(src), "--output", str(tmp_path / "o"))
    assert p.returncode == 1
    line = p.stderr.strip().splitlines()[-1]
    assert "b.parquet" in line and len(line) > 40 and "Traceback" not in p.stderr, line


@pytest.mark.integration
def test_invalid_utf8_and_separators_in_items_are_dead_lettered(tmp_path, small_log, small_cfg):
    t = day_table(small_log)
    users = [u.encode() for u in t.column("user_id").to_pylist()]
    users[4] = b"\xff\xfeuser"
    hist = t.column("hist_items").to_pylist()
    hist[9] = ["i0001", "a|b"]
    t = set_column(t, "hist_items", hist, pa.list_(pa.string()))
    t = t.set_column(t.schema.get_field_index("user_id"), "user_id",  # Parquet does not check UTF-8 on write
                     pa.array(users, pa.binary()).cast(pa.string(), safe=False))
    log = write_table(tmp_path / "log" / "p.parquet", t)
    out = str(tmp_path / "o")
    res = run_preprocess(small_cfg, log, out, IN_MEMORY, **QUIET)
    assert res.dead_letter == {"invalid_utf8": 1, "list_item_has_separator": 1}
    dead = pq.read_table(PreprocessedData(out).dead_letter_files()).to_pylist()
    assert {(d["row"], d["reason"], d["field"]) for d in dead} == {(4, "invalid_utf8", "user_id"),
                                                                   (9, "list_item_has_separator", "hist_items")}


@pytest.mark.integration
def test_unknown_options_are_errors(tmp_path, small_log):
    p = run_cli("preprocess", "--config", config_file(tmp_path), "--input", small_log, "--output", str(tmp_path / "o"),
                "--previous-transfrom", str(tmp_path))
    assert p.returncode == 1 and "--previous-transfrom (did you mean --previous-transform?)" in p.stderr
    assert not (tmp_path / "o").exists()
    with pytest.raises(BeamOptionsError, match="--direct_num_wrkers"):
        run_preprocess(parse_config(small_config_dict()), small_log, str(tmp_path / "o"),
                       ["--direct_num_wrkers=2"], **QUIET)


@pytest.mark.integration
def test_stale_staging_and_temp_folders_are_removed(tmp_path, small_log, small_cfg, trained):
    dead_pid = 4_000_000  # above pid_max: never a live process
    stale = tmp_path / f".out.staging-{dead_pid}-abcd1234"
    stale.mkdir()
    said = []
    run_preprocess(small_cfg, small_log, str(tmp_path / "out"), IN_MEMORY, say=said.append)
    assert not stale.exists() and any("left by a run that was killed" in s for s in said)
    base = tmp_path / "exp"
    (base / f".tmp-7-{dead_pid}-abcd1234").mkdir(parents=True)
    export_model(trained, str(base), version=2)
    assert sorted(os.listdir(base)) == ["2"]


@pytest.mark.integration
def test_criteo_converter_keeps_bad_rows_for_the_dead_letter(tmp_path):
    from recpipe.pipeline.criteo import CRITEO_COLUMNS
    rows = [",".join([str(r % 2) if i == 0 else str(r) if i < 14 else f"c{i}" for i in range(40)]) for r in range(40)]
    rows[2] = "yes" + rows[2][1:]
    csv = tmp_path / "c.csv"
    csv.write_text(",".join(CRITEO_COLUMNS) + "\n" + "\n".join(rows) + "\n1,2,3\n")
    out = run_cli("criteo-to-parquet", "--csv", str(csv), "--output", str(tmp_path / "pq"))
    assert out.returncode == 0 and "1 line(s) with the wrong number of fields" in out.stdout
    assert (tmp_path / "pq" / "c.rejected.csv").read_text().splitlines()[1].startswith("42,")
    table = pq.read_table(tmp_path / "pq" / "c.parquet")
    assert table.num_rows == 40 and table.schema.field("label").type == pa.string()  # kept as text: ...
    res = run_preprocess(load_config(Path(__file__).parents[1] / "configs" / "criteo.yaml"), str(tmp_path / "pq"),
                         str(tmp_path / "pre"), IN_MEMORY, **QUIET)
    assert res.dead_letter == {"label_unparsable": 1}  # ... so preprocess dead-letters exactly that row
