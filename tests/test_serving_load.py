"""The model server under load and abuse: batching, metrics, fuzzed bodies, hot version swap."""
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recpipe.serving.export.savedmodel import export_model
from recpipe.serving.server.serve import ModelServer, ServeOptions

from helpers import raw_rows

pytestmark = pytest.mark.system


def _post(port, body, path="/v1/models/small:predict", timeout=30):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory, trained):
    base = str(tmp_path_factory.mktemp("served"))
    export_model(trained, base, version=1)
    srv = ModelServer(ServeOptions(base, "small", rest_port=0, grpc_port=None, poll_seconds=0.2,
                                   max_batch_rows=64, batch_timeout_ms=5)).start()
    yield srv, base
    srv.stop()


def test_batched_answers_equal_direct_calls(batching_server, small_log, small_cfg):
    srv, _ = batching_server
    rows, _ = raw_rows(small_log, small_cfg, 40)
    lv = srv.registry.get()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda r: _post(srv.rest_port, {"instances": [r]}), rows))
    assert all(code == 200 for code, _ in results)
    served = [json.loads(b)["predictions"][0] for _, b in results]
    from recpipe.serving.server.rest import parse_predict_body
    direct = lv.predict(parse_predict_body({"instances": rows}, lv.inputs)[0])["score"]
    np.testing.assert_allclose(served, direct, atol=1e-6)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.rest_port}/monitoring/prometheus/metrics").read().decode()
    sizes = [line for line in metrics.splitlines() if line.startswith("recpipe_batch_size_count")]
    assert sizes and float(sizes[0].split()[-1]) < 40  # concurrent single-row requests were merged
    assert 'recpipe_requests_total{api="rest_predict",code="200"}' in metrics
    assert "recpipe_request_latency_seconds_bucket" in metrics and "recpipe_model_version" in metrics
    # every stage of every request is timed, and the stages fit inside the server's request time
    from recpipe.bench.serve import breakdown, scrape_stages
    from recpipe.serving.server.metrics import STAGES
    scraped = scrape_stages(srv.rest_port)
    assert all(scraped[s][1] >= 40 for s in STAGES) and scraped["server"][1] >= 40
    b = breakdown({}, scraped, client_mean_ms=1e9)
    assert all(b[s] > 0 for s in STAGES) and b["model"] > b["validate"]
    assert sum(b[s] for s in STAGES) <= b["server"] * 1.001


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12)
column = st.sampled_from(["user_id", "item_id", "hist_items", "C1", "I1", "I2", "I3", "bogus"])
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"instances": st.lists(st.dictionaries(column, json_values, max_size=5), max_size=4)}),
    st.fixed_dictionaries({"inputs": st.dictionaries(column, st.lists(json_values, max_size=3), max_size=4)}),
    st.binary(max_size=64),
)


def test_fuzzed_bodies_never_5xx_and_the_server_stays_up(batching_server):
    """Hypothesis-made bodies (JSON of any shape, row and columnar requests with odd values, raw bytes):
    never a 5xx, every error answer carries its message, and the server still answers /healthz after."""
    srv, _ = batching_server

    @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies)
    def post(body):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        code, payload = _post(srv.rest_port, raw)
        assert code < 500, (body, payload)
        if code != 200:
            assert json.loads(payload)["error"]

    post()
    assert urllib.request.urlopen(f"http://127.0.0.1:{srv.rest_port}/healthz", timeout=10).status == 200


def test_version_swap_under_load_loses_no_request(batching_server, trained, small_log, small_cfg):
    srv, base = batching_server
    rows, _ = raw_rows(small_log, small_cfg, 8)
    stop = threading.Event()
    codes: list[int] = []
    versions_seen: set = set()
    lock = threading.Lock()

    def client(i):
        while not stop.is_set():
            code, body = _post(srv.rest_port, {"instances": rows[i % 8: i % 8 + 1]})
            with lock:
                codes.append(code)
            if len(codes) > 6000:
                break

    def poll_version():
        while not stop.is_set():
            status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{srv.rest_port}/v1/models/small").read())
            versions_seen.add(status["model_version_status"][0]["version"])
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)] + [threading.Thread(target=poll_version)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        export_model(trained, base, version=2)
        deadline = time.monotonic() + 60
        while srv.registry.get().version != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # the status poller (one thread among the clients) must see the swap too, not only the registry
        while ("2" not in versions_seen or len(codes) < 2000) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert srv.registry.get().version == 2 and {"1", "2"} <= versions_seen
    assert len(codes) >= 2000 and set(codes) == {200}, (len(codes), sorted(set(codes)))


def test_many_clients_connecting_at_once(batching_server, small_log, small_cfg):
    """socketserver's default backlog of 5 reset connections when 32 clients connected together."""
    srv, _ = batching_server
    rows, _ = raw_rows(small_log, small_cfg, 1)
    barrier = threading.Barrier(64)

    def one(_):
        barrier.wait(timeout=30)
        return _post(srv.rest_port, {"instances": rows})[0]

    with ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(one, range(64)))
    assert codes == [200] * 64
