"""The sidecar application: routing, measurement of one request, health, drain, engine scraping.

`make_app(config, registry, tracer_provider)` builds it with injected back-ends; `server.py`
serves it with the sidecar's own HTTP/1.1 server (`sidecar.fastserver`, requests are
`FastRequest`s) or aiohttp's low-level one (`web.BaseRequest`s); `Sidecar.handle` takes either
(no router or middleware on the hot path), and `sidecar.relay` writes the response for each. The
sidecar's own paths are /healthz, /readyz, /metrics and /advice; everything else goes to the upstream,
and POSTs to .../chat/completions and .../completions are measured. Measured requests go through
`sidecar.upstream` (protocol-level client, tokens relayed from data_received); the rest, health
probes and engine scrapes through an aiohttp ClientSession.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.advice import render as render_prompt
from sidecar.advisor import Advisor
from sidecar.admission import Admission
from sidecar.config import ProxyConfig
from sidecar.engine_metrics import EngineCollector, normalise
from sidecar.metrics import ModelLabels, SidecarMetrics, zero_series
from sidecar.otel_metrics import GenAiMetrics
from sidecar.ratelog import RateLimitedLog
from sidecar.relay import (BadRequestBody, BodyTooLarge, error_response, open_upstream, read_body, relay_passthrough, relay_sse,
                           send_body, upstream_headers)
from sidecar.slo import judge
from sidecar.timing import StreamTimer
from sidecar.tracing import NoSpan, RequestSpan, records_spans
from sidecar.upstream import UpstreamFailed, UpstreamPool

log = logging.getLogger("goodput.sidecar")
_limited = RateLimitedLog(log)      # lines a client can trigger at will
_clock = time.perf_counter
OWN_PATHS = ("/healthz", "/readyz", "/metrics", "/advice")


def measured_kind(method: str, path: str) -> str | None:
    if method != "POST":
        return None
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completion"
    return None


class Sidecar:
    def __init__(self, config: ProxyConfig, registry: CollectorRegistry, tracer_provider, meter_provider=None):
        self.config = config
        self.registry = registry
        self.models = ModelLabels(config.models)
        self.metrics = SidecarMetrics(registry, config.slo)
        zero_series(self.metrics, config.models, config.slo)
        self.admission = Admission(config.slo)   # the goodput guard: off unless a class enables it
        self.engine = EngineCollector()
        registry.register(self.engine)
        self.advisor = Advisor(config.advice_window or 1, prefill_rate=self.engine.prefill_seconds_per_token)
        registry.register(self.advisor)
        self.tracer = tracer_provider.get_tracer("goodput.sidecar")
        self._spans = records_spans(tracer_provider)    # False: NoSpan, trace context passed through as sent
        parts = urlsplit(config.upstream)
        self._server_address, self._server_port = parts.hostname or "", parts.port
        self.otel = None if meter_provider is None else GenAiMetrics(
            meter_provider, config.genai_provider, self._server_address, self._server_port, config.otel_legacy_metrics)
        self.session: aiohttp.ClientSession | None = None   # passthrough paths, health, scrapes
        self.pool = UpstreamPool(config.upstream, config.connect_timeout, config.read_timeout)  # measured path
        self.draining = False
        self._active = 0                       # proxied requests in progress (drain waits for 0)
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task] = set()  # request handlers, cancelled if drain times out
        self._forced = False
        self._scraper: asyncio.Task | None = None
        self._ready_cache = (0.0, False)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        # limit=0: the engine's batch decides concurrency, not the pool; keep-alive reuses sockets.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout,
                                        sock_read=self.config.read_timeout)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                             skip_auto_headers=("User-Agent", "Accept-Encoding"))
        if self.config.engine_metrics_interval > 0:
            self._scraper = asyncio.create_task(self._scrape_loop())

    async def close(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            await asyncio.gather(self._scraper, return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        await self.pool.close()

    @property
    def active(self) -> int:
        return self._active

    def begin_drain(self) -> None:
        self.draining = True
        self.metrics.draining.set(1)

    async def wait_drained(self, timeout: float) -> bool:
        """Wait for in-flight requests; past `timeout`, cancel them. True if all finished."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            self._forced = True
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0.05)
            return False

    # ---- routing -----------------------------------------------------------------------------
    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path in OWN_PATHS and request.method in ("GET", "HEAD"):
            return await self._own(path)
        if self.draining:
            # Connection: close as well, so a keep-alive client reconnects (to another replica,
            # through the Service) instead of sending this one every request until it is gone.
            refused = error_response(503, "the sidecar is draining; retry on another replica", "draining",
                                     headers={"Retry-After": "1"})
            refused.force_close()
            return refused
        self._active += 1
        self._idle.clear()
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            kind = measured_kind(request.method, path)
            if kind is not None:
                return await self._measured(request, kind)
            return await self._passthrough(request)
        except ConnectionResetError:
            # The client went away while we wrote (already accounted as cancelled); end the
            # handler the way aiohttp ends one it cancels, instead of logging a 500.
            raise asyncio.CancelledError() from None
        finally:
            self._tasks.discard(task)
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _own(self, path: str) -> web.Response:
        if path == "/metrics":
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
        if path == "/advice":
            return web.json_response(self.advisor.report())
        if path == "/healthz":
            return web.json_response({"status": "alive"})
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if not await self._upstream_reachable():
            return web.json_response({"status": "upstream unreachable", "upstream": self.config.upstream}, status=503)
        return web.json_response({"status": "ready"})

    async def _upstream_reachable(self) -> bool:
        """Any HTTP answer below 500 from the upstream's /health counts (a 404 still means it is up);
        cached for a second so probes cannot load the upstream."""
        checked_at, ok = self._ready_cache
        if _clock() - checked_at < 1.0:
            return ok
        try:
            async with self.session.get(self.config.upstream + "/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                ok = resp.status < 500
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            ok = False
        self._ready_cache = (_clock(), ok)
        return ok

    async def _passthrough(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            body = await read_body(request, self.config.max_body_bytes)
            upstream = await open_upstream(self.session, request.method, self._url(request),
                                           upstream_headers(request, measured=False), body or None)
        except BodyTooLarge:
            return self._too_large()
        except BadRequestBody as exc:
            self.metrics.malformed.inc()      # unmeasured, so counted here (measured ones: an error)
            out = error_response(400, str(exc), "invalid_request_error")
            out.force_close()
            return out
        except UpstreamFailed as exc:
            return error_response(exc.status, exc.message, exc.error_type)
        try:
            return await relay_passthrough(request, upstream)
        finally:
            upstream.release()

    def _url(self, request: web.BaseRequest) -> str:
        return self.config.upstream + request.raw_path

    def _too_large(self) -> web.Response:
        return error_response(413, f"request body larger than --max-body-bytes={self.config.max_body_bytes}",
                              "request_too_large")

    # ---- one measured request ----------------------------------------------------------------
    async def _measured(self, request: web.BaseRequest, kind: str) -> web.StreamResponse:
        """Proxy one chat/completions request and account it exactly once, however it ends."""
        start = _clock()
        capture = self.config.capture_content
        operation = "chat" if kind == "chat" else "text_completion"
        span = RequestSpan(self.tracer, operation, request.headers, start, self._server_address, self._server_port,
                           self.config.genai_provider) if self._spans else NoSpan(operation)
        label = ModelLabels.OTHER
        slo = self.config.slo.classify(None, request.path, request.headers)
        timer = StreamTimer(start, kind)
        in_flight = False
        arrival_counted = False
        error_type = None
        cancelled = False
        upstream = None
        doc = None
        ticket = None
        try:
            try:
                body = await read_body(request, self.config.max_body_bytes)
            except BodyTooLarge:
                error_type = "request_too_large"
                return self._too_large()
            doc = _json_object(body)
            model = doc.get("model") if isinstance(doc.get("model"), str) else None
            stream = doc.get("stream") is True
            max_tokens = doc.get("max_tokens", doc.get("max_completion_tokens"))
            label = self.models.label(model)
            slo = self.config.slo.classify(model, request.path, request.headers)
            strip = False
            if stream and self.config.inject_usage:
                options = doc.get("stream_options")
                if not (isinstance(options, dict) and options.get("include_usage")):
                    body = _with_usage(body, doc, options)
                    strip = True
            timer = StreamTimer(start, kind, strip_usage=strip, collect_text=capture,
                                on_first=self.metrics.decoding.began)
            span.request_attributes(model, stream, max_tokens if isinstance(max_tokens, int) else None)
            if capture:
                span.capture_input(doc)
            ticket = self.admission.arrive(slo, doc, stream, timer, _clock())
            if ticket.held or ticket.shed:
                self.metrics.arrived_now(label, slo.name)   # before it is held or shed
                arrival_counted = True
                if ticket.held:
                    await self._hold(ticket)
                if ticket.shed:
                    return self._shed(ticket)
            headers = upstream_headers(request, measured=True)
            span.inject(headers)

            def sent() -> None:
                # Counted as soon as the request has left for the engine, not before: the
                # bookkeeping runs while the request travels, off its TTFT.
                nonlocal arrival_counted, in_flight
                if not arrival_counted:
                    self.metrics.arrived_now(label, slo.name)
                    arrival_counted = True
                self.metrics.started(label, slo.name)
                in_flight = True

            upstream = await self.pool.request("POST", request.raw_path, headers, body, sent)
            head = upstream.head
            if head.status == 200 and head.content_type == "text/event-stream":
                out, error_type = await relay_sse(request, upstream, timer, _clock)
            else:
                out, answer = await send_body(request, upstream)
                timer.feed_json_body(answer, _clock())
                if head.status >= 400:
                    error_type = f"http_{head.status}"
            return out
        except UpstreamFailed as exc:
            error_type = exc.error_type
            return error_response(exc.status, exc.message, exc.error_type)
        except BadRequestBody as exc:
            # Refused before anything was sent upstream; counted once below, as an error.
            error_type = "invalid_request_error"
            out = error_response(400, str(exc), error_type)
            if exc.close:
                out.force_close()
            return out
        except (asyncio.CancelledError, ConnectionResetError):
            if self._forced:
                error_type = "drain_timeout"
            elif not timer.done_seen:
                # A client that hangs up after `data: [DONE]` reached it was served in full
                # (some clients close as soon as they see it); only earlier exits are cancellations.
                cancelled = True
            raise
        except Exception as exc:
            error_type = type(exc).__name__
            _limited.log(logging.ERROR, error_type, "proxy failure on %s", request.path[:200], exc_info=exc)
            raise
        finally:
            if upstream is not None:
                if error_type is not None or cancelled or self._forced:
                    self.pool.discard(upstream)   # closes the socket: the engine frees the request at once
                else:
                    self.pool.release(upstream)
            end = _clock()
            timing = timer.finish(end)
            error_type = error_type or timing.error_type
            shed = ticket is not None and ticket.shed
            verdict = judge(timing, slo, error=error_type if not cancelled else None, cancelled=cancelled, shed=shed)
            self.metrics.finished(label, slo, timing, verdict, in_flight=in_flight, arrival_counted=arrival_counted)
            if self.otel is not None:
                self.otel.record(span.operation, label, slo.name, timing, None if cancelled else error_type,
                                 successful=error_type is None and not cancelled)
            if ticket is not None:
                self.metrics.admission(label, slo.name, ticket, self.admission.finish(ticket, timing))
                span.admission(ticket)
                if self.admission.held:
                    self._review_held()   # a slot may have freed: the longest-held request of the highest class goes first
            span.end(timing, verdict, slo, None if cancelled else error_type, end, capture_output=capture)
            if doc and self.config.advice_window:
                self._advise(label, request.headers.get("x-tenant"), doc, timing)

    def _advise(self, label: str, tenant: str | None, doc: dict, timing) -> None:
        """Prompt-layout advice, after the response went out; never fails the request."""
        try:
            chunks = render_prompt(doc)
            if chunks is not None:
                computed = (timing.input_tokens - (timing.cached_tokens or 0)
                            if timing.input_tokens is not None else None)
                self.advisor.observe(label, tenant, chunks, timing.input_tokens, prefill_seconds=timing.engine_prefill,
                                     computed_tokens=computed)
        except Exception:   # noqa: BLE001 - advice is best effort, the request is already served
            log.exception("prompt-layout advice failed")

    async def _hold(self, ticket) -> None:
        """Wait, without a socket to the engine, until the guard admits or sheds a request it held
        for a decode slot: at a finish (`_review_held`) or at its deadline at the latest."""
        loop = asyncio.get_running_loop()
        ticket.waiter = loop.create_future()
        timer = loop.call_at(loop.time() + max(0.0, ticket.deadline - _clock()) + 0.001, self._review_held)
        try:
            await ticket.waiter
        except asyncio.CancelledError:
            self.admission.withdraw(ticket, _clock())   # the client went away while it waited
            raise
        finally:
            timer.cancel()

    def _review_held(self) -> None:
        for decided in self.admission.review(_clock()):
            if decided.waiter is not None and not decided.waiter.done():
                decided.waiter.set_result(None)

    @staticmethod
    def _shed(ticket) -> web.Response:
        return error_response(429, ticket.detail, "rate_limit_exceeded", headers={"Retry-After": str(ticket.retry_after)})

    # ---- engine signals ----------------------------------------------------------------------
    async def scrape_once(self) -> bool:
        single = self.config.models[0] if len(self.config.models) == 1 else None
        try:
            timeout = aiohttp.ClientTimeout(total=max(1.0, min(5.0, self.config.engine_metrics_interval)))
            async with self.session.get(self.config.upstream + "/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            self.engine.update(normalise(text, self.models, single))
            return True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            log.debug("engine scrape failed: %s", exc)
            self.engine.update(None)
            return False

    async def _scrape_loop(self) -> None:
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.config.engine_metrics_interval)


_TOO_DEEP = "the request body nests JSON deeper than the sidecar parses (about 1,000 levels)"


def _json_object(body: bytes) -> dict:
    """The request body as a dict; anything else (not JSON, a list) is forwarded as is and the
    upstream answers with its own error, so the sidecar never rejects what the engine accepts.
    JSON nested too deep to parse (RecursionError) is the exception: no OpenAI request nests past
    a few levels, and forwarding what the sidecar cannot read would leave it unmeasured."""
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    except RecursionError:
        raise BadRequestBody(_TOO_DEEP) from None
    return doc if isinstance(doc, dict) else {}


def _with_usage(body: bytes, doc: dict, options) -> bytes:
    """The request body asking for a usage chunk. Without stream_options the client's bytes are
    kept and the key is spliced in before the closing brace (the body parsed as a non-empty
    object, so it ends with `}`); otherwise the object is re-serialised."""
    if "stream_options" not in doc:
        end = body.rstrip().rfind(b"}")
        if end > 0:
            return body[:end] + b',"stream_options":{"include_usage":true}' + body[end:]
    doc["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    try:
        return json.dumps(doc).encode()
    except RecursionError:
        raise BadRequestBody(_TOO_DEEP) from None


def make_app(config: ProxyConfig, registry: CollectorRegistry, tracer_provider, meter_provider=None) -> Sidecar:
    """The sidecar with injected back-ends; call `await app.start()` inside a running loop.
    `meter_provider`: OpenTelemetry metrics beside Prometheus (None: none recorded)."""
    return Sidecar(config, registry, tracer_provider, meter_provider)
