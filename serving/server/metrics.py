"""Server metrics on prometheus_client, in its text exposition format (GET /monitoring/prometheus/metrics).

One registry per server (several servers can run in one process, e.g. in tests):
  recpipe_requests_total{api, code}        requests by API (rest_get, rest_predict, grpc_*) and status
                                           (the HTTP code, or the gRPC status name)
  recpipe_request_latency_seconds{api}     histogram
  recpipe_batch_size                       rows per model call, histogram
  recpipe_stage_seconds{stage}             where a predict request's time goes, histogram per stage:
                                           read (the body off the socket), parse (JSON to columns),
                                           validate (dtypes, shapes), queue (waiting for a batch to
                                           form and start),
                                           model (the model call it was part of), handoff (from the
                                           model call's end until the request's thread runs again),
                                           respond (formatting and JSON-encoding the answer)
  recpipe_model_version{model}             the version being served
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics", "LATENCY_BUCKETS_S", "BATCH_BUCKETS", "STAGES", "STAGE_BUCKETS_S"]

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
STAGE_BUCKETS_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
STAGES = ("read", "parse", "validate", "queue", "model", "handoff", "respond")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        self._requests = Counter("recpipe_requests", "Requests by API and status.", ["api", "code"],
                                 registry=self.registry)
        self._latency = Histogram("recpipe_request_latency_seconds", "Request latency.", ["api"],
                                  buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self._batch = Histogram("recpipe_batch_size", "Rows per model call.", buckets=BATCH_BUCKETS,
                                registry=self.registry)
        self._stage = Histogram("recpipe_stage_seconds", "Time of a predict request per stage.", ["stage"],
                                buckets=STAGE_BUCKETS_S, registry=self.registry)
        self._version = Gauge("recpipe_model_version", "Version being served.", ["model"], registry=self.registry)
        # labelled children looked up once: labels() takes a lock and builds its key on every call, and a
        # predict request records up to 9 series on the REST event loop
        self._stages = {s: self._stage.labels(stage=s) for s in STAGES}
        self._children: dict[tuple[str, str], tuple] = {}

    def request(self, api: str, code: str, seconds: float) -> None:
        children = self._children.get((api, code))
        if children is None:
            children = self._children[(api, code)] = (self._requests.labels(api=api, code=code),
                                                      self._latency.labels(api=api))
        children[0].inc()
        children[1].observe(seconds)

    def stage(self, stage: str, seconds: float) -> None:
        self._stages[stage].observe(seconds)

    def batch(self, rows: int) -> None:
        self._batch.observe(rows)

    def version(self, model: str, version: int) -> None:
        self._version.labels(model=model).set(version)

    def requests_count(self, api: str, code: str) -> float:
        return self._requests.labels(api=api, code=code)._value.get()

    def render(self) -> bytes:
        return generate_latest(self.registry)
