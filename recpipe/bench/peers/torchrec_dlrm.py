"""TorchRec's DLRM on the embedding-heavy model of `recpipe bench embedding`, in a plain PyTorch loop.

A standalone script for the bench's isolated environment (recpipe.bench.isolated_env): it imports torch,
torchrec, fbgemm_gpu and numpy, never recpipe or TensorFlow, and runs as `python -I torchrec_dlrm.py
REQUEST.json`. The request (recpipe.bench.torchrec_peer.torchrec_request) names the .npz files of the train
and eval splits the bench exported from our shards, the model, the run and the files to write.

The model is `torchrec.models.dlrm.DLRM` over a `FusedEmbeddingBagCollection`: FBGEMM's table-batched
embedding (TBE) CPU kernels, one lookup for all tables, with the sparse optimizer fused into the backward
pass (EXACT_ADAGRAD, or EXACT_ROWWISE_ADAGRAD). The dense layers use torch.optim.Adagrad. Tables start
uniform in +-init_range and Adagrad's accumulators at initial_accumulator, as Keras' Embedding and Adagrad.
The train split is held in memory, shuffled once; the second half of the steps is timed. With "parts" it
also times, on fixed in-memory batches, each part of a step (see _parts).
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection, convert_optimizer_type_and_kwargs
from torchrec.optim import RowWiseAdagrad

OPTIMIZERS = {"adagrad": torch.optim.Adagrad, "rowwise_adagrad": RowWiseAdagrad}


def build(req: dict) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The DLRM and the dense layers' optimizer; the tables' optimizer is fused into their backward."""
    torch.manual_seed(req["seed"])
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=req["dim"], num_embeddings=rows,
                                 feature_names=[name])
              for i, (name, rows) in enumerate(zip(req["features"], req["tables"]))]
    kwargs = {"lr": req["learning_rate"], "eps": req["epsilon"]}
    ebc = FusedEmbeddingBagCollection(tables=tables, optimizer_type=OPTIMIZERS[req["optimizer"]],
                                      optimizer_kwargs=kwargs, device=torch.device("cpu"))
    with torch.no_grad():
        for weight in ebc.state_dict().values():
            weight.uniform_(-req["init_range"], req["init_range"])
        for state in ebc.fused_optimizer().state_dict()["state"].values():
            for slot in state.values():
                if isinstance(slot, torch.Tensor) and slot.is_floating_point():
                    slot.fill_(req["initial_accumulator"])
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=req["dense_features"],
                 dense_arch_layer_sizes=[*req["bottom_layers"], req["dim"]],
                 over_arch_layer_sizes=[*req["deep_layers"], 1])
    dense = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch.")]
    opt = torch.optim.Adagrad(dense, lr=req["learning_rate"], eps=req["epsilon"],
                              initial_accumulator_value=req["initial_accumulator"])
    return model, opt


def to_batch(keys: list[str], sparse: np.ndarray, dense: np.ndarray) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One batch as DLRM takes it: dense [B, 13], and the IDs as a KeyedJaggedTensor (feature-major, one ID
    per feature and row)."""
    ids = torch.from_numpy(np.ascontiguousarray(sparse.T)).reshape(-1)
    lengths = torch.ones(ids.numel(), dtype=torch.int32)
    return torch.from_numpy(dense), KeyedJaggedTensor(keys=keys, values=ids, lengths=lengths)


def train(req: dict, model, opt, data) -> float:
    """`steps` steps over the shuffled train split; examples/s of the second half."""
    keys, (sparse, dense, label) = req["features"], data
    b, steps, n = req["batch_size"], req["steps"], len(label) // req["batch_size"]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    half, t0 = steps // 2, time.perf_counter()
    for step in range(steps):
        if step == half:
            t0 = time.perf_counter()
        i = (step % n) * b
        x, kjt = to_batch(keys, sparse[i:i + b], dense[i:i + b])
        y = torch.from_numpy(label[i:i + b])
        opt.zero_grad()
        loss = loss_fn(model(x, kjt).squeeze(1), y)
        loss.backward()
        opt.step()
    return (steps - half) * b / (time.perf_counter() - t0)


def predict(req: dict, model, path: str) -> np.ndarray:
    """Click probabilities of every eval row, in the file's order."""
    ev = np.load(path)
    out = []
    with torch.no_grad():
        for i in range(0, len(ev["label"]), 4096):
            x, kjt = to_batch(req["features"], ev["sparse"][i:i + 4096], ev["dense"][i:i + 4096])
            out.append(torch.sigmoid(model(x, kjt).squeeze(1)).numpy())
    return np.concatenate(out)


def _ms(fn, rounds: int, steps: int) -> float:
    """Median over rounds of the mean ms of `steps` calls of fn(i)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(steps):
            fn(i)
        times.append(1000 * (time.perf_counter() - t0) / steps)
    return float(np.median(times))


def _parts(req: dict, model, opt, data) -> dict:
    """ms per step of each part on 4 fixed in-memory batches, each timed alone (rounds x steps calls):
    input (numpy slices to tensors and a KeyedJaggedTensor), lookup forward (the TBE kernel, no grad), the
    interaction and the MLPs forward and backward on fixed inputs, the dense optimizer step, and the whole
    step; what the whole step has beyond the others is the lookup's backward with its fused sparse update,
    and the loss."""
    keys, (sparse, dense, label) = req["features"], data
    b, rounds, steps = req["batch_size"], req["parts_rounds"], req["parts_steps"]
    batches = [to_batch(keys, sparse[i * b:(i + 1) * b], dense[i * b:(i + 1) * b]) for i in range(4)]
    labels = [torch.from_numpy(label[i * b:(i + 1) * b]) for i in range(4)]
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def full(i):
        x, kjt = batches[i % 4]
        opt.zero_grad()
        loss_fn(model(x, kjt).squeeze(1), labels[i % 4]).backward()
        opt.step()

    def lookup(i):
        with torch.no_grad():
            model.sparse_arch(batches[i % 4][1])

    with torch.no_grad():
        embedded = [model.sparse_arch(kjt) for _, kjt in batches]
        bottom = [model.dense_arch(x) for x, _ in batches]
    emb = [e.clone().requires_grad_(True) for e in embedded]
    bot = [x.clone().requires_grad_(True) for x in bottom]
    inter = [model.inter_arch(x, e).detach().requires_grad_(True) for x, e in zip(bottom, embedded)]

    def interaction(i):
        model.inter_arch(bot[i % 4], emb[i % 4]).sum().backward()

    def mlps(i):
        x = model.dense_arch(batches[i % 4][0])
        (model.over_arch(inter[i % 4]).sum() + x.sum()).backward()

    full(0)  # every gradient exists for the optimizer's step

    def dense_step(i):
        opt.step()

    for fn in (full, lookup, interaction, mlps, dense_step):  # warm up
        fn(0)
    ms = {"input": _ms(lambda i: to_batch(keys, sparse[(i % 4) * b:(i % 4 + 1) * b],
                                         dense[(i % 4) * b:(i % 4 + 1) * b]), rounds, steps),
          "lookup_forward": _ms(lookup, rounds, steps), "interaction": _ms(interaction, rounds, steps),
          "mlp": _ms(mlps, rounds, steps), "dense_optimizer": _ms(dense_step, rounds, steps),
          "step": _ms(full, rounds, steps)}
    ms["lookup_backward_sparse_update_loss"] = ms["step"] - sum(
        ms[k] for k in ("lookup_forward", "interaction", "mlp", "dense_optimizer"))
    return ms


def main(path: str) -> None:
    with open(path) as fh:
        req = json.load(fh)
    torch.set_num_threads(req["threads"])
    torch.set_num_interop_threads(req["threads"])
    tr = np.load(req["train"])
    rng = np.random.default_rng(req["seed"])
    order = rng.permutation(len(tr["label"]))  # shuffled once, as the TFRS peer's in-memory data
    data = (tr["sparse"][order], tr["dense"][order], tr["label"][order].astype(np.float32))
    model, opt = build(req)
    rate = train(req, model, opt, data)
    np.save(req["predictions"], predict(req, model, req["eval"]))
    import fbgemm_gpu
    import torchrec
    out = {"examples_per_s_steady": rate, "examples": req["steps"] * req["batch_size"],
           "train_rows_in_memory": int(len(order)), "threads": torch.get_num_threads(),
           "fused_optimizer": convert_optimizer_type_and_kwargs(OPTIMIZERS[req["optimizer"]], {})[0].name,
           "versions": {"torch": torch.__version__, "torchrec": getattr(torchrec, "__version__", None),
                        "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", None)}}
    if req.get("parts"):
        out["parts_ms"] = _parts(req, model, opt, data)
    with open(req["output"], "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1])
