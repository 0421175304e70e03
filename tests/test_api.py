"""recpipe's Python API end to end: each stage returns the artifact the next one reads."""
from __future__ import annotations

import json
import urllib.request

import pytest

import recpipe


@pytest.mark.system
def test_the_api_chains_preprocess_train_evaluate_export_serve(tmp_path, small_log, small_cfg_path):
    data = recpipe.preprocess(small_cfg_path, small_log, str(tmp_path / "pre"))
    assert isinstance(data, recpipe.PreprocessedData) and data.is_complete()
    model = recpipe.train(data, str(tmp_path / "model"), steps=20)
    assert isinstance(model, recpipe.ModelDir) and model.latest_step() == 20
    metrics = recpipe.evaluate(model, data)
    assert metrics["examples"] == data.transform().row_counts["eval"]
    version = recpipe.export(model, str(tmp_path / "export"), data=data)
    assert isinstance(version, recpipe.ExportedVersion) and version.is_complete()
    with recpipe.serve(str(tmp_path / "export"), rest_port=0, grpc_port=None) as server:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}/v1/models/default") as answer:
            status = json.load(answer)["model_version_status"][0]
    assert status["version"] == str(version.version) and status["state"] == "AVAILABLE"
