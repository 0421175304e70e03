"""implicit's alternating least squares on the train clicks the quality bench exported (recpipe.bench.als_peer),
run in the peer environment.

For each configuration (factors, regularization, alpha) and seed of the request: fit on the train query x item
matrix, then fold in each history matrix the request names (query x item: what each query clicked before the
split being scored) with the item factors fixed (implicit's `recalculate_user`, an exact least-squares solve).
Writes the item factors and each history's query factors; the bench scores them (query factors @ item factors)
and chooses the configuration on validation.

Request (JSON): train (a scipy .npz), histories ({split: .npz}), configs ([{factors, regularization, alpha}]),
seeds, iterations, threads, factors (.npz to write: items_C_SEED, users_SPLIT_C_SEED), report (.json to write).
"""
from __future__ import annotations

import json
import sys

import numpy as np
import scipy.sparse as sp


def main(argv: list[str]) -> int:
    from implicit.cpu.als import AlternatingLeastSquares
    import implicit
    with open(argv[1]) as fh:
        request = json.load(fh)
    train = sp.load_npz(request["train"]).tocsr().astype(np.float32)
    histories = {s: sp.load_npz(p).tocsr().astype(np.float32) for s, p in request["histories"].items()}
    out, fits = {}, []
    for c, config in enumerate(request["configs"]):
        for seed in request["seeds"]:
            model = AlternatingLeastSquares(factors=config["factors"], regularization=config["regularization"],
                                            alpha=config["alpha"], iterations=request["iterations"],
                                            num_threads=request["threads"], random_state=seed)
            model.fit(train, show_progress=False)
            out[f"items_{c}_{seed}"] = np.asarray(model.item_factors)
            for split, history in histories.items():
                out[f"users_{split}_{c}_{seed}"] = model.recalculate_user(np.arange(history.shape[0]), history)
            fits.append({"config": c, "seed": seed})
    np.savez(request["factors"], **out)
    with open(request["report"], "w") as fh:
        json.dump({"fits": fits, "version": implicit.__version__}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
