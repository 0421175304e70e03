"""Where one training step of a ranking config goes (issue 16: the roofline), measured by ablation in one
process: the compiled train step on fixed in-memory batches (no input pipeline), then the same model
without its cross layers, then without cross and deep layers. The differences are the cross layers'
and the deep layers' time; what remains is the embedding lookups (and ID dedup), the logit, the loss
and the optimizer's updates. The input pipeline's share is the train suite's real vs synthetic runs.

    python -m recpipe.bench.step_parts DATA CONFIG [STEPS]   -> one JSON line on stdout
"""
from __future__ import annotations

import copy
import json
import sys
import time

import tensorflow as tf
import yaml

from features.config import parse_config
from features.preprocessed import PreprocessedData
from trainers.data import make_dataset
from trainers.models import build_model
from trainers.optim import optimizer_for

__all__ = ["step_parts"]

VARIANTS = {"full": {}, "no_cross": {"cross_layers": 0}, "embeddings_only": {"cross_layers": 0, "deep_layers": []}}


def _step_ms(cfg_dict: dict, data_dir: str, batches: list, steps: int) -> float:
    cfg = parse_config(cfg_dict)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg, PreprocessedData(data_dir).transform())
    model.compile(optimizer=optimizer_for(cfg, own_step=True))
    step = tf.function(model.train_step)
    for b in batches:  # trace and warm up
        step(b)
    t0 = time.perf_counter()
    for i in range(steps):
        out = step(batches[i % len(batches)])
    float(out["loss"])
    return 1000 * (time.perf_counter() - t0) / steps


def step_parts(data_dir: str, cfg_dict: dict, steps: int = 30) -> dict:
    """ms per step of each variant, and the parts they give (ms and share of the full step)."""
    if cfg_dict["model"].get("type") != "dcn_v2":
        raise ValueError("step_parts: a dcn_v2 ranking config")
    cfg = parse_config(cfg_dict)
    it = iter(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=False))
    batches = [next(it) for _ in range(4)]
    ms = {}
    for name, model in VARIANTS.items():
        c = copy.deepcopy(cfg_dict)
        c["model"] = {**c["model"], **model}
        ms[name] = _step_ms(c, data_dir, batches, steps)
    parts = {"cross_layers": ms["full"] - ms["no_cross"], "deep_layers": ms["no_cross"] - ms["embeddings_only"],
             "embeddings_loss_optimizer": ms["embeddings_only"]}
    return {"batch_size": cfg.train.batch_size, "steps": steps, "step_ms": ms, "parts_ms": parts,
            "parts_share": {k: v / ms["full"] for k, v in parts.items()}}


def main(argv: list[str]) -> None:
    with open(argv[1]) as fh:
        cfg = yaml.safe_load(fh)
    print(json.dumps(step_parts(argv[0], cfg, int(argv[2]) if len(argv) > 2 else 30)))


if __name__ == "__main__":
    main(sys.argv[1:])
