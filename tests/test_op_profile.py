"""recpipe.bench.op_profile: kernel times read back from a profile, and summed by group; the embedding suite's
grouping of its DLRM step."""
from __future__ import annotations

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from recpipe.bench.embedding import STEP_GROUPS
from recpipe.bench.embedding_parts import dlrm_group
from recpipe.bench.op_profile import grouped, kernel_ms, split_name


def _space(path, events: dict[str, list[tuple[str, int]]]) -> str:
    """An XSpace with a host plane whose lines hold (name, duration in µs) events."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids: dict[str, int] = {}
    for line_name, evs in events.items():
        line = plane.lines.add(name=line_name)
        for name, us in evs:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].name = name
            line.events.add(metadata_id=ids[name], duration_ps=us * 1_000_000)
    space.planes.add(name="Task Environment")
    with open(path, "wb") as fh:
        fh.write(space.SerializeToString())
    return str(path)


@pytest.mark.unit
def test_kernel_times_are_summed_over_executor_threads_per_call_without_wrappers(tmp_path):
    path = _space(tmp_path / "a.xplane.pb", {
        "tf_Compute/1": [("ExecutorState::Process", 900), ("deep_0/MatMul:_MklMatMul", 300),
                         ("ParallelFor", 250), ("Adagrad/Gather:ResourceGather", 100)],
        "tf_numa_-1_Eigen/2": [("deep_0/MatMul:_MklMatMul", 100)],
        "python": [("train_step:train_step", 5_000)]})
    got = kernel_ms(path, calls=2)
    assert got == pytest.approx({"deep_0/MatMul:_MklMatMul": 0.2, "Adagrad/Gather:ResourceGather": 0.05})


@pytest.mark.unit
def test_names_split_into_scope_type_and_pass():
    assert split_name("gradient_tape/deep_1/MatMul/MatMul_1:_MklMatMul") == (["deep_1", "MatMul", "MatMul_1"],
                                                                          "_MklMatMul", True)
    assert split_name("embeddings/GatherV2_3:GatherV2") == (["embeddings", "GatherV2_3"], "GatherV2", False)
    assert grouped({"a/x:T": 1.0, "b/y:T": 3.0, "a/z:U": 0.5}, lambda s, k, b: s[0]) == {"b": 3.0, "a": 1.5}


@pytest.mark.unit
def test_the_dlrm_step_s_kernels_fall_into_the_suite_s_groups():
    group = dlrm_group("embeddings", "dot_interaction", {"bottom_0", "bottom_1"}, {"deep_0", "deep_1", "logit"},
                       "Adagrad")
    expect = {
        "Adagrad/ResourceScatterUpdate_3:ResourceScatterUpdate": "tables_adagrad",
        "Adagrad/Adagrad/update_2/ResourceApplyAdagradV2:ResourceApplyAdagradV2": "dense_adagrad",
        "embeddings/GatherV2_3:GatherV2": "lookup_forward",
        "embeddings/emb_C3/embedding_lookup:ResourceGather": "lookup_forward",
        "gradient_tape/embeddings/emb_C3/embedding_lookup/Reshape/tensor:UnsortedSegmentSum": "lookup_backward",
        "dot_interaction/MatMul:_MklBatchMatMulV2": "interaction_products",
        "gradient_tape/dot_interaction/MatMul/MatMul_1:_MklBatchMatMulV2": "interaction_products",
        "gradient_tape/dot_interaction/transpose/transpose:_MklTranspose": "interaction_layout",
        "dot_interaction/concat:ConcatV2": "interaction_layout",
        "dot_interaction/bottom_0/MatMul:_MklNativeFusedMatMul": "mlps",
        "gradient_tape/deep_1/MatMul/MatMul_1:_MklMatMul": "mlps",
        "logit/MatMul:_MklNativeFusedMatMul": "mlps",
        "ranking/Cumsum:Cumsum": "loss_metrics_other",
        "AddN_1:AddN": "loss_metrics_other",
    }
    assert {name: group(*split_name(name)) for name in expect} == expect
    assert set(expect.values()) == set(STEP_GROUPS)  # every group has a label, and every label a group
