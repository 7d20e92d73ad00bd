"""An OTLP/HTTP receiver for `goodput bench sidecar`'s `sidecar-otlp` arm: the collector stand-in
the sidecar exports its spans and GenAI metrics to, so the benchmark measures what exporting
costs the sidecar (the SDK's export thread encodes and posts from the sidecar's process).

It answers every POST to /v1/traces and /v1/metrics with 200 and an empty export response, as an
OpenTelemetry Collector does, and counts what arrived: GET /stats gives the posts, the bytes and
the spans (each traces body parsed), so a run shows the spans really left. GET /health answers
once it listens. It runs on the load side's cores, as a collector would run elsewhere. The
sidecar's OTLP tests use it in-process (`make_server(port, keep=True)`) to read what was sent.

    python -m sidecar.bench.otlp_sink --port 4318
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_MAX_BODY = 64 * 1024 * 1024


class Received:
    """What arrived: counts, and with `keep` the bodies themselves (`traces`, `metrics`; tests
    read them)."""

    def __init__(self, keep: bool = False):
        self.lock = threading.Lock()
        self.trace_posts = self.metric_posts = self.spans = self.bytes = self.unparsed = 0
        self.keep = keep
        self.traces: list[bytes] = []
        self.metrics: list[bytes] = []

    def as_dict(self) -> dict:
        with self.lock:
            return {"trace_posts": self.trace_posts, "metric_posts": self.metric_posts, "spans": self.spans,
                    "bytes": self.bytes, "unparsed": self.unparsed}


def _span_count(body: bytes) -> int | None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except Exception:   # noqa: BLE001 - a body the sink cannot read is counted, not fatal
        return None
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def make_server(port: int, host: str = "127.0.0.1", keep: bool = False) -> tuple[ThreadingHTTPServer, Received]:
    """The receiver, not yet serving (`serve_forever()`), and what it counts; `keep`: the bodies too."""
    counts = Received(keep)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as the exporter's requests session expects

        def log_message(self, *args) -> None:   # quiet: the benchmark keeps this process's log
            pass

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, b"{}", "application/json")
            elif self.path == "/stats":
                self._answer(200, json.dumps(counts.as_dict()).encode(), "application/json")
            else:
                self._answer(404, b"{}", "application/json")

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= _MAX_BODY:
                self.close_connection = True
                self._answer(400, b"{}", "application/json")
                return
            body = self.rfile.read(length)
            if self.path not in ("/v1/traces", "/v1/metrics"):
                self._answer(404, b"{}", "application/json")
                return
            spans = _span_count(body) if self.path == "/v1/traces" else 0
            with counts.lock:
                counts.bytes += len(body)
                if self.path == "/v1/traces":
                    counts.trace_posts += 1
                    counts.spans += spans or 0
                    counts.unparsed += spans is None
                else:
                    counts.metric_posts += 1
                if counts.keep:
                    (counts.traces if self.path == "/v1/traces" else counts.metrics).append(body)
            # An empty Export*ServiceResponse: zero bytes of protobuf.
            self._answer(200, b"", "application/x-protobuf")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server, counts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="OTLP/HTTP receiver for goodput bench sidecar (counts what arrives)")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    server, _ = make_server(args.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
