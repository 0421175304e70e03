"""`recpipe bench --quick`: the CI smoke run of every benchmark suite (figures are not asserted;
that every suite runs end to end and reports every ratio key, plots included, is)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from recpipe.bench.targets import SUITES, TARGETS


def test_quick_bench_runs_every_suite_and_reports_every_ratio(tmp_path):
    out = tmp_path / "results"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "recpipe.cli", "bench", "--quick", "--out", str(out), "--workdir",
                    str(tmp_path / "work")], check=True, capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    ratios = {}
    for suite in SUITES:
        result = json.loads((out / f"{suite}.json").read_text())
        assert result["quick"] is True and result["machine"]["cpus"] >= 1
        assert result["machine"]["versions"]["tensorflow"] == "2.21.0"
        ratios.update(result["ratios"])
        assert (out / f"{suite}.md").read_text().startswith("#")
    assert set(TARGETS) <= set(ratios), set(TARGETS) - set(ratios)
    assert all(isinstance(v, float) and v > 0 for v in ratios.values()), ratios
    train = json.loads((out / "train.json").read_text())
    assert train["ceiling_gflops"]["bf16"]["median"] > 0 and train["ceiling_gflops"]["fp32"]["median"] > 0
    assert {r["workers"] for r in train["scale_out"]["predictions"]} == {8, 64, 512}
    assert len(train["rss_vs_table"]["table_rows"]) >= 2
    report = (out / "REPORT.md").read_text()
    for key in TARGETS:
        assert key in report
    for png in ("preprocess_throughput.png", "train_throughput.png", "train_rss_vs_table.png", "serve_latency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
        assert f"]({png})" in report
    print(f"bench --quick took {elapsed:.0f} s")
