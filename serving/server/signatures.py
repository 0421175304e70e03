"""Which signature a Predict request runs and which of its outputs it gets, as TF Serving decides.

TF Serving's Predict runs any signature of the model by name ("" is `serving_default`), so a client may
send a ranking export's serialized tf.Examples to `predict_examples` through Predict; `output_filter`
picks among the signature's outputs (tensorflow_serving/servables/tensorflow/predict_util.cc). The
front ends call `serving_default` through the Predictor (validation, batching); every other signature
runs here, on its own inputs.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import tensorflow as tf

from recpipe.serving.server.registry import SIGNATURE, LoadedVersion, RequestError, graph_error

__all__ = ["SignatureNotFound", "predict_signature", "signature_inputs", "signature_outputs", "output_aliases",
           "run_signature"]


class SignatureNotFound(RequestError):
    """A Predict request names a signature the model does not have (gRPC FAILED_PRECONDITION, as TF Serving
    answers it; REST 400)."""


def _functions(lv: LoadedVersion) -> dict:
    """The version's signatures by name (the SavedModel's, without its `__saved_model_init_op`)."""
    if lv.loaded is None:  # a LoadedVersion built around serving_default alone
        return {SIGNATURE: lv.fn}
    return lv.loaded.signatures


def predict_signature(lv: LoadedVersion, requested: str) -> str:
    """The signature a Predict request runs.

    Args:
        lv: the version the request is for.
        requested: the request's signature_name; "" means `serving_default`.

    Returns:
        The signature's name.

    Raises:
        SignatureNotFound: the version has no such signature.
    """
    name = requested or SIGNATURE
    if name != SIGNATURE and name not in _functions(lv):
        have = ", ".join(repr(n) for n in sorted(_functions(lv)))
        raise SignatureNotFound(f"signature {name!r} not found; this model has {have}")
    return name


def signature_inputs(lv: LoadedVersion, name: str) -> dict[str, tf.TensorSpec]:
    """The inputs of signature `name` (predict_signature's result) by name, with their specs."""
    return lv.inputs if name == SIGNATURE else dict(_functions(lv)[name].structured_input_signature[1])


def signature_outputs(lv: LoadedVersion, name: str) -> list[str]:
    """The output aliases of signature `name` (predict_signature's result), sorted."""
    return lv.outputs if name == SIGNATURE else sorted(_functions(lv)[name].structured_outputs)


def output_aliases(outputs: list[str], output_filter: Iterable[str]) -> list[str]:
    """The outputs a Predict request gets: those its output_filter names, in its order, or every one when
    it names none (TF Serving's PreProcessPrediction).

    Args:
        outputs: the signature's output aliases.
        output_filter: the request's output_filter.

    Returns:
        The output aliases to answer with.

    Raises:
        RequestError: an alias is not an output of the signature, or is named twice.
    """
    chosen: list[str] = []
    for alias in output_filter:
        if alias not in outputs:
            raise RequestError(f"output tensor alias not found in signature: {alias!r}; outputs expected to be in "
                               f"the set {{{','.join(sorted(outputs))}}}")
        if alias in chosen:
            raise RequestError(f"duplicate output tensor alias: {alias!r}")
        chosen.append(alias)
    return chosen or list(outputs)


def run_signature(lv: LoadedVersion, name: str, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call signature `name` (not `serving_default`: the Predictor runs that) on a request's inputs.

    Args:
        lv: the version to run.
        name: the signature, as predict_signature returned it.
        columns: the request's inputs by name, each of the signature's dtype and a shape it takes.

    Returns:
        The signature's outputs by alias.

    Raises:
        RequestError: an input is missing, unknown, of another dtype or shape, or the graph refuses a value.
    """
    specs = signature_inputs(lv, name)
    missing, extra = sorted(set(specs) - set(columns)), sorted(set(columns) - set(specs))
    if missing:
        raise RequestError(f"missing input(s): {', '.join(missing)}")
    if extra:
        raise RequestError(f"unknown input(s): {', '.join(extra)}; the signature takes {', '.join(specs)}")
    tensors = {}
    for input_name, values in columns.items():
        spec = specs[input_name]
        try:
            tensor = tf.convert_to_tensor(values)
        except (TypeError, ValueError) as e:
            raise RequestError(f"input {input_name!r}: {str(e).splitlines()[0]}") from None
        if tensor.dtype != spec.dtype:
            raise RequestError(f"input {input_name!r}: expects {spec.dtype.name}, got {tensor.dtype.name}")
        if not spec.shape.is_compatible_with(tensor.shape):
            raise RequestError(f"input {input_name!r}: expects shape {spec.shape.as_list()}, got "
                               f"{tensor.shape.as_list()}")
        tensors[input_name] = tensor
    try:
        out = _functions(lv)[name](**tensors)
    except tf.errors.InvalidArgumentError as e:
        raise RequestError(f"{name}: {graph_error(e.message)}") from None
    return {k: v.numpy() for k, v in out.items()}
