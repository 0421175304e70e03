"""The `recpipe` CLI as a user runs it: each command in its own process, the whole chain, the demo."""
import json
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import CONFIGS, SHARED_DATA
from recpipe.localserver import free_ports, rest_rows, wait_healthy

COMMANDS = ["generate", "criteo-to-parquet", "preprocess", "train", "advise", "evaluate", "export", "serve", "demo",
            "bench"]


def recpipe(*args, check=True, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "recpipe.cli", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"recpipe {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.mark.unit
def test_every_command_has_help(capsys):
    """`recpipe --help` names every command, and each has its own help (the parser the CLI runs)."""
    from recpipe.cli_parser import build_parser

    def help_of(*args: str) -> str:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*args, "--help"])
        assert done.value.code == 0
        return capsys.readouterr().out
    out = help_of()
    for cmd in COMMANDS:
        assert cmd in out
        assert "usage: recpipe " + cmd in help_of(cmd)


@pytest.mark.unit
def test_every_command_has_a_description_an_example_and_help_for_every_flag(capsys):
    """Each subcommand's --help says what it does, gives an example that parses, and documents every flag;
    `recpipe --version` names the installed version."""
    import argparse
    import shlex

    from recpipe.cli_parser import EXAMPLES, build_parser
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(sub.choices) == sorted(EXAMPLES)
    missing = []
    for name, command in sub.choices.items():
        if not command.description or f"example: {EXAMPLES[name]}" not in (command.epilog or ""):
            missing.append(f"{name}: description or example")
        missing += [f"{name} {a.option_strings or a.dest}: help" for a in command._actions
                    if not a.help and not isinstance(a, argparse._HelpAction)]
        args = parser.parse_known_args(shlex.split(EXAMPLES[name])[1:])[0]  # the example parses
        assert args.command == name
    assert missing == []
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.startswith("recpipe ")


@pytest.mark.integration
def test_bad_input_is_one_clear_line(tmp_path):
    """Each command's bad input ends its process with exit code 1 and one `recpipe CMD: error:` line, no
    traceback (the four commands run side by side)."""
    bad = tmp_path / "c.yaml"
    bad.write_text("name: x\nfeatures: {sparse: [{name: a, column: a, vocab: {min_cnt: 1}}]}\n")
    runs = [("preprocess", "--config", str(bad), "--input", str(tmp_path), "--output", str(tmp_path / "o")),
            ("preprocess", "--config", str(CONFIGS / "synthetic.yaml"), "--input", str(tmp_path / "none"),
             "--output", str(tmp_path / "o")),
            ("evaluate", "--model-dir", str(tmp_path), "--data", str(tmp_path)),
            ("generate", "--rows", "0", "--output", str(tmp_path / "g"))]
    with ThreadPoolExecutor(len(runs)) as pool:
        unknown_key, no_input, no_model, no_rows = pool.map(lambda args: recpipe(*args, check=False), runs)
    last = unknown_key.stderr.strip().splitlines()[-1]
    assert last.startswith("recpipe preprocess: error: ") and "features.sparse[0].vocab.min_cnt: unknown key" in last
    for p in (unknown_key, no_input, no_model, no_rows):
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "no such file or directory" in no_input.stderr
    assert "not a model directory" in no_model.stderr
    assert "rows and days must be positive" in no_rows.stderr


@pytest.mark.system
def test_whole_chain_through_the_cli(tmp_path):
    """generate -> preprocess -> train (bf16) -> evaluate and export -> serve, each command in its own process
    (evaluate runs beside export and serve): the model learnt (eval AUC 0.63 on this log, seed 5) and the
    server answers a prediction for raw rows of the log."""
    log, pre, model, export = (str(tmp_path / n) for n in ("log", "pre", "model", "export"))
    recpipe("generate", "--rows", "20000", "--days", "3", "--output", log, "--seed", "5")
    out = recpipe("preprocess", "--config", str(CONFIGS / "synthetic.yaml"), "--input", log, "--output", pre).stdout
    assert "rows in = 20000 = rows out" in out
    out = recpipe("train", "--config", str(CONFIGS / "synthetic.yaml"), "--data", pre, "--model-dir", model,
                  "--steps", "80", "--precision", "bf16").stdout
    assert "step 80/80" in out
    with ThreadPoolExecutor(1) as pool:
        evaluated = pool.submit(recpipe, "evaluate", "--model-dir", model, "--data", pre, "--output",
                                str(tmp_path / "m.json"))
        out = recpipe("export", "--model-dir", model, "--export-base", export).stdout
        version = out.strip().split("/")[-1]
        port, gport = free_ports(2)
        server = subprocess.Popen([sys.executable, "-m", "recpipe.cli", "serve", "--export-base", export,
                                   "--model-name", "synthetic_ctr", "--rest-port", str(port),
                                   "--grpc-port", str(gport)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_healthy(port, server)
            files = sorted(str(p) for p in (tmp_path / "log").rglob("*.parquet"))
            cols = ["user_id", "item_id", "hist_items", *[f"C{i}" for i in range(1, 27)],
                    *[f"I{i}" for i in range(1, 14)]]
            rows, _ = rest_rows(files[-1], cols, 3)
            url = f"http://127.0.0.1:{port}/v1/models/synthetic_ctr/versions/{version}:predict"
            req = urllib.request.Request(url, data=json.dumps({"instances": rows}).encode())
            preds = json.loads(urllib.request.urlopen(req, timeout=30).read())["predictions"]
            assert len(preds) == 3 and all(0 < p < 1 for p in preds)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
        assert server.returncode == 0
        metrics = json.loads(evaluated.result().stdout.strip().splitlines()[-1])
    # > 0.6 holds for this log (0.631; 0.635 after 120 steps); over other seeds it is 0.595-0.631 (not a quality claim)
    assert metrics["examples"] == 2000 and metrics["auc"] > 0.6, metrics


@pytest.mark.system
@pytest.mark.skipif(not (SHARED_DATA / "criteo_10k.csv").is_file(), reason="../shared/data Criteo sample absent")
def test_demo_on_the_real_criteo_sample(tmp_path):
    """`recpipe demo` (the README's first command) on the Criteo sample: every stage, a model that learnt from
    real clicks, five scores from its server."""
    out = recpipe("demo", "--workdir", str(tmp_path / "demo"), "--steps", "60").stdout
    summary = json.loads((tmp_path / "demo" / "demo_summary.json").read_text())
    assert summary["data"] == "criteo_10k" and summary["eval_examples"] == 999
    assert summary["auc"] > 0.65, summary  # real clicks, 9k training rows: 0.71 after 60 steps, 0.74 after 150
    assert len(summary["scores"]) == 5 and "server stopped" in out


@pytest.mark.unit
def test_a_keras_layer_error_is_reported_by_its_cause_not_its_call_arguments():
    """Keras ends a layer's error with the call's arguments ("• x=tf.Tensor(...)"): the one error line
    names the layer and the cause instead."""
    import tensorflow as tf

    from recpipe.runtime import one_line

    class Failing(tf.keras.layers.Layer):
        def call(self, x):
            raise ValueError("variable must be of type tf.ResourceVariable")

    with pytest.raises(ValueError) as raised:
        Failing(name="cross_0")(tf.zeros([2, 3]))
    assert "Call arguments received" in str(raised.value)
    assert one_line(raised.value) == "layer 'cross_0' (Failing): variable must be of type tf.ResourceVariable"


@pytest.mark.unit
def test_only_a_ps_chief_takes_a_temp_folder_of_its_own(tmp_path, monkeypatch):
    """The PS chief's temporary files (AutoGraph's) go to a folder it removes as it exits; a worker or PS
    task that TF_CONFIG starts serves until it is killed, so it takes none (each used to leave one)."""
    import tempfile

    from recpipe.runtime import own_tempdir
    cluster = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"], "ps": ["10.0.0.3:2222"]}
    for task, own in (("worker", False), ("ps", False), ("chief", True), (None, True)):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        if task is None:
            monkeypatch.delenv("TF_CONFIG", raising=False)
        else:
            monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}}))
        own_tempdir()
        made = [p.name for p in tmp_path.iterdir()]
        assert (tempfile.tempdir != str(tmp_path)) == own and len(made) == int(own), (task, made)
        for p in tmp_path.iterdir():
            p.rmdir()
