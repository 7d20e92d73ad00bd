"""An OpenAI-shaped upstream that records every request it receives, byte for byte.

The fuzz tests use it to prove what the sidecar forwarded: a smuggling attempt refused with 400
must leave no trace here. It runs on the caller's event loop (the sidecar thread's), parses
requests strictly (the sidecar always frames bodies with Content-Length) and answers completions
with a two-token SSE stream (usage included when asked) or a JSON body; other paths get a small
JSON document.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field


@dataclass
class Received:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class RecordingUpstream:
    received: list[Received] = field(default_factory=list, repr=False)
    protocol_errors: list[str] = field(default_factory=list)   # requests it could not parse
    port: int = 0
    _server: asyncio.base_events.Server | None = None
    _writers: set = field(default_factory=set, repr=False)

    async def start(self) -> "RecordingUpstream":
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        # Close open connections while the loop still runs: a handler left waiting would be
        # finalised after its loop has closed, and its `finally` could not close the socket.
        for writer in list(self._writers):
            writer.close()
        await asyncio.sleep(0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                lines = head[:-4].decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    self.protocol_errors.append(f"bad request line {lines[0]!r}")
                    return
                headers = [tuple(s.strip() for s in line.split(":", 1)) for line in lines[1:]]
                if any(len(h) != 2 for h in headers):
                    self.protocol_errors.append(f"bad header in {lines!r}")
                    return
                lengths = [v for k, v in headers if k.lower() == "content-length"]
                if any(k.lower() == "transfer-encoding" for k, _ in headers) or len(lengths) > 1:
                    self.protocol_errors.append(f"ambiguous framing forwarded: {headers!r}")
                    return
                body = await reader.readexactly(int(lengths[0]) if lengths else 0)
                self.received.append(Received(parts[0], parts[1], headers, body))
                await self._answer(parts[0], parts[1], body, writer)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            self.protocol_errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, method: str, target: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        path = target.split("?", 1)[0]
        if method == "POST" and path.endswith("completions"):
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):
                doc = None
            if not isinstance(doc, dict):
                return _send(writer, 400, {"error": {"message": "body is not a JSON object",
                                                     "type": "invalid_request_error", "param": None, "code": 400}})
            if doc.get("stream") is True:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                chat = path.endswith("chat/completions")
                for text in ("Hello", " world"):
                    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                    _chunk(writer, b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
                if isinstance(doc.get("stream_options"), dict) and doc["stream_options"].get("include_usage"):
                    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
                    _chunk(writer, b"data: " + json.dumps(usage).encode() + b"\n\n")
                _chunk(writer, b"data: [DONE]\n\n")
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                return
            return _send(writer, 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello world"},
                                                    "finish_reason": "stop"}],
                                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        if path == "/health":
            return _send(writer, 200, {"status": "ok"})
        return _send(writer, 200, {"path": path, "method": method}, head_only=method == "HEAD")


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _send(writer: asyncio.StreamWriter, status: int, doc: dict, head_only: bool = False) -> None:
    body = json.dumps(doc).encode()
    writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (status, len(body), b"" if head_only else body))
