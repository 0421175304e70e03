"""`recpipe serve`: the REST and gRPC front ends over one ModelRegistry, until SIGINT/SIGTERM."""
from __future__ import annotations

import logging
import re
import signal
import threading
from dataclasses import dataclass
from typing import Optional

from recpipe.common.errors import RecpipeError

from recpipe.serving.server.batching import Predictor
from recpipe.serving.server.metrics import Metrics
from recpipe.serving.server.registry import ModelRegistry
from recpipe.serving.server.rest import make_rest_server

__all__ = ["ServeOptions", "ModelServer", "ServeError"]

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # what the REST paths can address


class ServeError(RecpipeError, ValueError):
    pass


@dataclass(frozen=True)
class ServeOptions:
    export_base: str
    model_name: str
    host: str = "127.0.0.1"
    rest_port: int = 8501
    grpc_port: Optional[int] = 8500
    poll_seconds: float = 2.0
    max_batch_rows: int = 0          # 0: no server-side batching
    batch_timeout_ms: float = 0.0

    def __post_init__(self):
        if not MODEL_NAME.fullmatch(self.model_name):
            raise ServeError(f"--model-name {self.model_name!r}: letters, digits, '_', '.', '-', starting with a "
                             f"letter or digit (it is part of the REST paths)")


class ModelServer:
    """Starts the registry and both front ends; `rest_port`/`grpc_port` are the bound ports.

    Usable as a context manager: leaving the `with` block stops the server.

    Args:
        opts: the export base and name, the host and ports to bind (0: any free port; grpc_port None: no
            gRPC front end), the version poll interval and the server-side batching settings.

    Attributes:
        opts: the options given.
        metrics: the request metrics both front ends record.
        registry: the ModelRegistry that loads the versions of the export base and watches it for new ones.
        predictor: the Predictor that runs (and, with max_batch_rows > 0, batches) model calls.
        rest_port: the bound REST port (None until start()).
        grpc_port: the bound gRPC port (None until start(), and without a gRPC front end).
    """

    def __init__(self, opts: ServeOptions):
        self.opts = opts
        self.metrics = Metrics()
        self.registry = ModelRegistry(opts.export_base, opts.model_name, opts.poll_seconds)
        self.predictor = Predictor(self.metrics, opts.max_batch_rows, opts.batch_timeout_ms / 1000.0)
        self._rest = None
        self._grpc = None
        self.rest_port = self.grpc_port = None
        self._signalled = threading.Event()  # catch_signals' signal arrived

    def start(self) -> "ModelServer":
        """Load the model's versions, start watching for new ones, and start the REST (then gRPC) front end,
        each serving on its own daemon thread(s).

        Returns:
            This server, started, with `rest_port` and `grpc_port` set to the bound ports.

        Raises:
            RuntimeError: the export base holds no loadable version.
            OSError: a port is in use or cannot be bound, in one line naming it; what had started is
                stopped again (a server on that port keeps it to itself, as no port is shared).
        """
        self.registry.start()
        try:
            self._rest = make_rest_server(self.registry, self.predictor, self.metrics, self.opts.host,
                                          self.opts.rest_port)
            self.rest_port = self._rest.server_address[1]
            threading.Thread(target=self._rest.serve_forever, name="rest", daemon=True).start()
            if self.opts.grpc_port is not None:
                from recpipe.serving.server.grpc_service import make_grpc_server
                self._grpc, self.grpc_port = make_grpc_server(self.registry, self.predictor, self.metrics,
                                                              self.opts.host, self.opts.grpc_port)
                self._grpc.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "ModelServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop watching for versions, stop the batching predictor, shut the REST server down and stop the gRPC
        server (giving its in-flight calls 1 s); a front end that was not started is skipped."""
        self.registry.stop()
        self.predictor.stop()
        if self._rest is not None:
            self._rest.shutdown()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()

    def catch_signals(self) -> None:
        """From now on SIGINT/SIGTERM ask serve_until_signal to stop the server. Call it before start(): the
        REST port answers before the gRPC one is up, and a SIGTERM arriving in between would otherwise find
        the default disposition and kill the process (exit -15) instead of stopping it."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._signalled.set())

    def serve_until_signal(self, say=print) -> None:
        """Serve until catch_signals' signal arrives (at once if it came while starting), then stop.

        Args:
            say: where the line naming the model, its served version and the addresses goes.
        """
        say(f"serve: model {self.opts.model_name!r} version {self.registry.get().version} on "
            f"REST http://{self.opts.host}:{self.rest_port}"
            + (f", gRPC {self.opts.host}:{self.grpc_port}" if self.grpc_port else ""), )
        self._signalled.wait()
        self.stop()
        logging.getLogger("recpipe.serving").info("server stopped")
