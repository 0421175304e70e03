"""recpipe.trainers.memory: a config whose embedding tables cannot fit in the memory a training process may use fails
before they are built, naming them, instead of the process being killed for memory with no word (exit 137)."""
from __future__ import annotations

import pytest

from conftest import IN_MEMORY, small_config_dict
from recpipe.features.config import parse_config
from recpipe.pipeline.preprocess import run_preprocess
from recpipe.trainers.errors import TrainError
from recpipe.common.hostmem import GIB, _cgroup_headroom
from recpipe.trainers.memory import Holders, StateSize, holders_on_this_host, memory_verdict
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.train import _check_ps_task_memory, train


@pytest.mark.unit
def test_the_verdict_weighs_the_state_of_every_process_against_what_is_available():
    state = StateSize({"item_id": (30_000_000, 16), "user_id": (1_000, 8)}, slots=1, optimizer="adagrad")
    assert state.total == (30_000_000 * 16 + 1_000 * 8) * 4 * 2
    error, warning = memory_verdict(state, Holders(), int(3 * GIB), "a 3 GiB cgroup")
    assert warning is None and "need 3.58 GiB per process" in error
    assert "but 3.0 GiB is available (a 3 GiB cgroup)" in error
    assert "item_id 30,000,000 x 16 (3.58 GiB)" in error and "user_id" not in error  # tables too small to matter
    error, warning = memory_verdict(state, Holders(), int(5 * GIB), "host")  # fits; its likely peak (6.5 GiB) not
    assert error is None and "peak memory is likely about 6.5 GiB" in warning
    assert memory_verdict(state, Holders(), int(8 * GIB), "host") == (None, None)
    error, _ = memory_verdict(state, Holders(3), int(8 * GIB), "host")  # three Horovod ranks on one host: 10.7 GiB
    assert "3.58 GiB per process x 3 processes" in error
    # a PS task of a cluster holds its share: 1.79 of 3.58 GiB over 2 PS tasks
    error, _ = memory_verdict(state, Holders.ps_task(2), int(1.5 * GIB), "host")
    assert "need 1.79 GiB on this PS task, one of 2 holding the sharded tables" in error
    assert "(float32 weights 1.79 GiB x 2 in all)" in error and error.endswith("or give them hosts with more memory")
    error, warning = memory_verdict(state, Holders.ps_task(2), int(3 * GIB), "host")  # peak 0.8 + 1.6 x 1.79
    assert error is None and "peak memory is likely about 3.6 GiB" in warning
    error, _ = memory_verdict(state, Holders.local_ps(2), int(3 * GIB), "host")  # a local cluster: one copy
    assert "need 3.58 GiB on this host (its 2 PS tasks hold one copy between them)" in error


@pytest.mark.unit
def test_the_tightest_memory_cgroup_up_the_hierarchy_counts_without_its_inactive_page_cache(tmp_path):
    root = tmp_path / "cgroup"
    v1 = root / "memory" / "job" / "step"
    v1.mkdir(parents=True)
    (root / "memory" / "job" / "memory.limit_in_bytes").write_text(str(8 << 30))
    (root / "memory" / "job" / "memory.usage_in_bytes").write_text(str(1 << 30))
    (v1 / "memory.limit_in_bytes").write_text(str(3 << 30))
    (v1 / "memory.usage_in_bytes").write_text(str(2 << 30))
    (v1 / "memory.stat").write_text(f"cache 123\ntotal_inactive_file {1 << 30}\n")
    proc = tmp_path / "cgroup.txt"
    proc.write_text("4:memory:/job/step\n3:cpu:/job\n0::/\n")
    room, where = _cgroup_headroom(str(root), str(proc))
    assert room == 2 << 30 and where.endswith("step (limit 3.0 GiB)")  # 3 GiB - (2 - 1 inactive)
    v2 = tmp_path / "v2"
    (v2 / "pod").mkdir(parents=True)
    (v2 / "pod" / "memory.max").write_text(str(4 << 30))
    (v2 / "pod" / "memory.current").write_text(str(1 << 30))
    (v2 / "memory.max").write_text("max")
    proc.write_text("0::/pod\n")
    assert _cgroup_headroom(str(v2), str(proc))[0] == 3 << 30
    proc.write_text("0::/\n")
    assert _cgroup_headroom(str(v2), str(proc)) is None  # no limit


@pytest.mark.unit
def test_who_holds_the_tables_on_this_host():
    assert holders_on_this_host(RunOptions(strategy="local"), False) == Holders()
    assert holders_on_this_host(RunOptions(strategy="horovod", np=3), False).processes == 3
    assert holders_on_this_host(RunOptions(strategy="horovod", hosts="a:2,b", host_index=1), False).processes == 1
    assert holders_on_this_host(RunOptions(strategy="horovod", hosts="a:2,b", host_index=0), False).processes == 2
    assert holders_on_this_host(RunOptions(strategy="ps", ps_servers=3), False) == Holders.local_ps(3)
    assert holders_on_this_host(RunOptions(strategy="ps"), True) is None  # a TF_CONFIG chief: its PS tasks check
                                                                           # their own hosts


@pytest.mark.integration
def test_train_refuses_tables_no_host_can_hold_naming_them(tmp_path, small_log):
    d = small_config_dict()
    d["features"]["sparse"][0]["hash_buckets"] = 4_000_000_000  # user_id: 4e9 x 8 x 4 B x 2 = 238 GiB
    out = str(tmp_path / "pre")
    run_preprocess(parse_config(d), small_log, out, IN_MEMORY, say=lambda _: None)
    with pytest.raises(TrainError, match=r"user_id 4,000,000,000 x 8 \(238\.42 GiB\).*would be killed for memory"):
        train(TrainOptions(out, str(tmp_path / "model"), run=RunOptions(steps=2)), say=lambda _: None)
    assert not (tmp_path / "model" / "checkpoints").exists()
    # a local PS cluster: refused before any task starts; a TF_CONFIG cluster's PS task: its share, on its host
    with pytest.raises(TrainError, match=r"238\.42 GiB on this host \(its 2 PS tasks hold one copy between them\)"):
        train(TrainOptions(out, str(tmp_path / "ps"), run=RunOptions(strategy="ps", steps=2)), say=lambda _: None)
    with pytest.raises(TrainError, match=r"need 79\.47 GiB on this PS task, one of 3 holding .*more PS tasks"):
        _check_ps_task_memory(TrainOptions(out, str(tmp_path / "task")), 3, say=lambda _: None)
    said = []
    _check_ps_task_memory(TrainOptions(str(tmp_path / "missing"), str(tmp_path / "task")), 3, say=said.append)
    assert "its memory is not checked" in said[0]  # a PS task that cannot read the data still serves
