"""`recpipe bench --quick`: the CI smoke run of every benchmark suite (figures are not asserted;
that every suite runs end to end and reports every ratio key, plots included, is)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from recpipe.bench.targets import SUITES, TARGETS
from recpipe.netns import netns_available

# The cluster suite needs network namespaces (root); without them `bench` skips it and says why.
CLUSTER = netns_available()[0]
RUN = [s for s in SUITES if CLUSTER or s != "cluster"]


def test_quick_bench_runs_every_suite_and_reports_every_ratio(tmp_path):
    out = tmp_path / "results"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "recpipe.cli", "bench", "--quick", "--out", str(out), "--workdir",
                    str(tmp_path / "work")], check=True, capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    ratios = {}
    for suite in RUN:
        result = json.loads((out / f"{suite}.json").read_text())
        assert result["quick"] is True and result["machine"]["cpus"] >= 1
        assert result["machine"]["versions"]["tensorflow"] == "2.21.0"
        ratios.update(result["ratios"])
        assert (out / f"{suite}.md").read_text().startswith("#")
    # the quick cluster run shapes links to 100mbit only
    expected = {k for k in TARGETS if not k.endswith("_1gbit") and (CLUSTER or not k.startswith("cluster_"))}
    assert expected <= set(ratios), expected - set(ratios)
    assert all(isinstance(v, float) and v > 0 for v in ratios.values()), ratios
    if CLUSTER:
        _check_cluster(out, tmp_path)
    train = json.loads((out / "train.json").read_text())
    assert train["ceiling_gflops"]["bf16"]["median"] > 0 and train["ceiling_gflops"]["fp32"]["median"] > 0
    assert {r["workers"] for r in train["scale_out"]["predictions"]} == {8, 64, 512}
    assert len(train["rss_vs_table"]["table_rows"]) >= 2
    report = (out / "REPORT.md").read_text()
    for key in expected:
        assert key in report
    for png in ("preprocess_throughput.png", "train_throughput.png", "train_rss_vs_table.png", "serve_latency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
        assert f"]({png})" in report
    print(f"bench --quick took {elapsed:.0f} s")


def _check_cluster(out, tmp_path):
    """The cluster suite measured both links and its calibration feeds `recpipe advise --calibration`."""
    cluster = json.loads((out / "cluster.json").read_text())
    assert cluster["calibration"]["compute_probe_s"] > 0 and set(cluster["measured"]) == {"unshaped", "100mbit"}
    advice = subprocess.run([sys.executable, "-m", "recpipe.cli", "advise", "--data",
                             str(tmp_path / "work" / "cluster" / "pre"), "--workers", "2", "--ps-tasks", "2",
                             "--bandwidth-gbps", "0.1", "--calibration", str(out / "cluster.json")],
                            check=True, capture_output=True, text=True).stdout
    assert "+ measured overheads" in advice
