"""The trainer's tuning knobs change how the model is computed, never what it computes; the progress
bar; the allocator switch."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml

from conftest import small_config_dict
from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import ConfigError, parse_config


def _cfg(**tuning):
    d = small_config_dict()
    d["train"]["tuning"] = tuning
    return parse_config(d)


def _batch(preprocessed, cfg, n=128):
    from recpipe.trainers.data import make_dataset
    return next(iter(make_dataset(cfg, preprocessed[0], "train", n, training=False)))


def _model(cfg, preprocessed, seed=5):
    from recpipe.trainers.models import build_model, dummy_batch
    artifact = TransformArtifact.read(os.path.join(preprocessed[0], "transform"))
    tf.keras.utils.set_random_seed(seed)
    model = build_model(cfg, artifact)
    model(dummy_batch(cfg))
    return model


def _dense(grads):
    return [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.mark.integration
def test_id_dedup_gives_the_same_outputs_and_gradients_with_fewer_rows(preprocessed):
    from recpipe.trainers.models import accumulated_gradients
    plain_cfg, dedup_cfg = _cfg(dedup_ids=False), _cfg(dedup_ids=True)
    batch = _batch(preprocessed, plain_cfg)
    plain, dedup = _model(plain_cfg, preprocessed), _model(dedup_cfg, preprocessed)
    dedup.set_weights(plain.get_weights())
    np.testing.assert_allclose(plain(batch).numpy(), dedup(batch).numpy(), rtol=1e-5, atol=1e-6)
    g_plain, _ = accumulated_gradients(plain, batch, 1)
    g_dedup, _ = accumulated_gradients(dedup, batch, 1)
    for a, b in zip(_dense(g_plain), _dense(g_dedup)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # The shared item table (item_id + multivalent hist) gets one gradient row per distinct ID.
    names = [v.name for v in dedup.trainable_variables]
    item = next(i for i, n in enumerate(names) if "emb_item_id" in n)
    ids = np.concatenate([batch["item_id"].numpy(), batch["hist"].flat_values.numpy()])
    assert g_dedup[item].indices.shape[0] == len(np.unique(ids)) < g_plain[item].indices.shape[0]


def _sparse_indices(grads) -> list[np.ndarray]:
    return [g.indices.numpy() for g in grads if isinstance(g, tf.IndexedSlices)]


def _two_steps(cfg, preprocessed, batch, accum, opt) -> list[np.ndarray]:
    """A fresh model's weights and the optimizer's slots after two steps of the same gradients."""
    from recpipe.trainers.models import accumulated_gradients
    m = _model(cfg, preprocessed)
    grads, _ = accumulated_gradients(m, batch, accum)
    for _ in range(2):  # the second step divides by the accumulators the first one left
        opt.apply_gradients(zip(grads, m.trainable_variables))
    return m.get_weights() + [v.numpy() for v in opt.variables]


def _assert_same_steps(stock: list, ours: list) -> None:
    assert len(stock) == len(ours)
    moved = 0
    for a, b in zip(stock, ours):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-8)  # weights of about 0.05: 1e-8 is 2e-7 of them
        moved += not np.array_equal(a, b)
    assert moved, "our update computed bit for bit what the stock ops do: is the Adagrad override used?"


@pytest.mark.integration
@pytest.mark.parametrize("model", [{"type": "dcn_v2", "cross_layers": 1, "deep_layers": [16], "wide": True},
                                   {"type": "dlrm", "bottom_layers": [16], "deep_layers": [16]},
                                   {"type": "logistic"}])
def test_the_optimizer_skips_re_deduplicating_only_gradients_that_are_unique(preprocessed, model):
    """With ID dedup a model's sparse gradients have unique indices, so its optimizer need not make them
    unique again (recpipe.trainers.optim.sparse_grads_are_unique): checked for every ranking model, and two steps of
    the trusting optimizer (recpipe's Adagrad update) update every weight and accumulator as the stock one
    does, but for where the kernels add epsilon."""
    from recpipe.trainers.models import accumulated_gradients
    from recpipe.trainers.optim import optimizer_for, sparse_grads_are_unique
    d = small_config_dict()
    d["model"] = {"task": "ranking", **model}
    cfg = parse_config(d)
    assert sparse_grads_are_unique(cfg)
    batch = _batch(preprocessed, cfg)
    indices = _sparse_indices(accumulated_gradients(_model(cfg, preprocessed), batch, 1)[0])
    assert indices and all(len(np.unique(i)) == len(i) for i in indices)
    stock, ours = optimizer_for(cfg), optimizer_for(cfg, own_step=True)
    assert type(stock) is tf.keras.optimizers.Adagrad and hasattr(stock, "_deduplicate_sparse_grad")
    assert type(ours).__name__ == "UniqueSparseOwnAdagrad"  # tf-keras' method replaced, as above
    stock_steps = _two_steps(cfg, preprocessed, batch, 1, stock)
    _assert_same_steps(stock_steps, _two_steps(cfg, preprocessed, batch, 1, ours))
    # under PS each table's rows are updated inside one kernel instead: the same steps
    shared = optimizer_for(cfg, own_step=True, shared=True)
    _assert_same_steps(stock_steps, _two_steps(cfg, preprocessed, batch, 1, shared))


@pytest.mark.integration
def test_repeated_sparse_gradients_keep_the_optimizers_dedup(preprocessed):
    """Gradient accumulation (micro-batches' rows concatenated) and a retrieval model's uniform negatives (a
    second lookup of the item table) repeat indices: sparse_grads_are_unique says so, and our
    optimizer keeps tf-keras' dedup, stepping as the stock one does."""
    from recpipe.trainers.models import accumulated_gradients
    from recpipe.trainers.optim import optimizer_for, sparse_grads_are_unique
    accumulating = _cfg(grad_accum_steps=4)
    accumulating_batch = _batch(preprocessed, accumulating)
    grads, _ = accumulated_gradients(_model(accumulating, preprocessed), accumulating_batch, 4)
    assert not sparse_grads_are_unique(accumulating)
    assert any(len(np.unique(i)) < len(i) for i in _sparse_indices(grads))
    assert type(optimizer_for(accumulating, own_step=True)).__name__ == "OwnAdagrad"
    _assert_same_steps(
        _two_steps(accumulating, preprocessed, accumulating_batch, 4, optimizer_for(accumulating)),
        _two_steps(accumulating, preprocessed, accumulating_batch, 4, optimizer_for(accumulating, own_step=True)))
    d = small_config_dict()
    for negatives in (0, 64):  # uniform negatives: a second lookup of the item table
        d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["user_id", "hist"],
                      "candidate_features": ["item_id"], "tower_layers": [16], "uniform_negatives": negatives}
        retrieval = parse_config(d)
        grads, _ = accumulated_gradients(_model(retrieval, preprocessed), _batch(preprocessed, retrieval), 1)
        unique = all(len(np.unique(i)) == len(i) for i in _sparse_indices(grads))
        assert unique == sparse_grads_are_unique(retrieval) == (negatives == 0)


@pytest.mark.integration
def test_gradient_accumulation_matches_one_big_batch(preprocessed):
    from recpipe.trainers.models import accumulated_gradients
    cfg = _cfg(grad_accum_steps=4)
    batch = _batch(preprocessed, cfg)
    model = _model(cfg, preprocessed)
    g1, loss1 = accumulated_gradients(model, batch, 1)
    g4, loss4 = accumulated_gradients(model, batch, 4)
    assert float(loss1) == pytest.approx(float(loss4), rel=1e-5)
    for a, b in zip(_dense(g1), _dense(g4)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.integration
def test_xla_dense_part_computes_the_same_logits(preprocessed):
    cfg, jit_cfg = _cfg(), _cfg(jit_dense=True)
    batch = _batch(preprocessed, cfg)
    plain, jitted = _model(cfg, preprocessed), _model(jit_cfg, preprocessed)
    jitted.set_weights(plain.get_weights())
    assert jitted._top_xla is not None
    np.testing.assert_allclose(plain(batch, training=True).numpy(), jitted(batch, training=True).numpy(),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.unit
def test_tuning_is_validated_with_the_key_named():
    d = small_config_dict()
    d["train"]["tuning"] = {"grad_accum_steps": 3}  # batch_size 128
    with pytest.raises(ConfigError, match="train.tuning.grad_accum_steps"):
        parse_config(d)
    d["train"]["tuning"] = {"allocator": "mimalloc"}
    with pytest.raises(ConfigError, match="train.tuning.allocator"):
        parse_config(d)
    d["train"]["tuning"] = {"prefetch_batches": -1}
    with pytest.raises(ConfigError, match="train.tuning.prefetch_batches"):
        parse_config(d)


@pytest.mark.integration
def test_data_budget_and_prefetch_are_applied(preprocessed):
    from recpipe.trainers.data import make_dataset
    cfg = _cfg(data_ram_budget_mb=64, prefetch_batches=2)
    ds = make_dataset(cfg, preprocessed[0], "train", 64, training=True)
    assert ds.options().autotune.ram_budget == 64 << 20
    assert int(next(iter(ds))["item_id"].shape[0]) == 64


@pytest.mark.unit
def test_progress_bar_renders_and_draws_in_place():
    from recpipe.trainers.progress import ProgressBar, render
    line = render(150, 300, 12345.0, 0.4512, 75)
    assert line.startswith("[" + "#" * 14 + "." * 14 + "]") and "150/300" in line and "50%" in line
    assert "12,345 ex/s" in line and "loss 0.4512" in line and "eta 1:15" in line
    out = io.StringIO()
    bar = ProgressBar(10, 0, 32, stream=out, interval=0.0, enabled=True)
    for step in range(1, 11):
        bar.update(step, 0.5)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") >= 10 and "10/10 100%" in text and text.endswith("\n")
    quiet = io.StringIO()
    ProgressBar(10, 0, 32, stream=quiet).update(5)  # not a terminal: silent
    assert quiet.getvalue() == ""


@pytest.mark.unit
def test_steady_rate_skips_the_first_interval():
    from recpipe.trainers.progress import steady_rate
    assert steady_rate((100, 10.0), (300, 12.0), 1000, 5.0) == pytest.approx(100_000)
    assert steady_rate(None, None, 1000, 5.0) == 5.0
    assert steady_rate((300, 10.0), (300, 10.0), 1000, 5.0) == 5.0


@pytest.mark.unit
def test_allocator_lookup_and_clear_errors(monkeypatch):
    from recpipe.trainers import allocator
    assert allocator.loaded_allocator() == "system"
    with pytest.raises(allocator.AllocatorError, match="mimalloc"):
        allocator.find_library("mimalloc")
    assert allocator.resolve("auto") == ("tcmalloc", "auto")  # installed by `make install`
    assert allocator.resolve("system") == ("system", "configured")
    monkeypatch.setattr(allocator, "_DIRS", ("/nonexistent",))
    with pytest.raises(allocator.AllocatorError, match="apt-get install libjemalloc2"):
        allocator.find_library("jemalloc")
    name, why = allocator.resolve("auto")  # no library: the system allocator, and why
    assert name == "system" and "apt-get install libtcmalloc-minimal4" in why


@pytest.mark.integration
def test_train_runs_under_tcmalloc_by_default_and_the_system_allocator_when_asked(tmp_path, preprocessed):
    from recpipe.trainers.allocator import find_library
    find_library("tcmalloc")  # installed by `make install` (scripts/system_deps.sh); fails loudly if not
    # the re-exec says whether TensorFlow was loaded before it: then the process would import it twice
    code = ("import os, sys; real = os.execve; "
            "os.execve = lambda *a: (print('exec: tensorflow ' + ('loaded' if 'tensorflow' in sys.modules "
            "else 'not loaded'), flush=True), real(*a)); "
            "from recpipe.cli import main; sys.exit(main(sys.argv[1:]))")
    runs = {}
    for allocator in ("auto", "system"):  # both processes at once: each spends most of its time importing
        d = small_config_dict()
        if allocator != "auto":
            d["train"]["tuning"] = {"allocator": allocator}
        cfg_path = tmp_path / f"{allocator}.yaml"
        cfg_path.write_text(yaml.safe_dump(d))
        runs[allocator] = subprocess.Popen([sys.executable, "-c", code, "train", "--data", preprocessed[0],
                                            "--model-dir", str(tmp_path / allocator), "--config", str(cfg_path),
                                            "--steps", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for allocator, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        assert ("allocator tcmalloc" in out) == (allocator == "auto"), out
        assert ("exec: tensorflow not loaded" in out) == (allocator == "auto") and "tensorflow loaded" not in out, out
        state = json.loads((tmp_path / allocator / "train_state.json").read_text())
        assert state["steps_done"] == 5 and state["allocator"] == ("tcmalloc" if allocator == "auto" else "system")
