"""A raw-socket HTTP/1.1 client for the fuzz tests: send exact bytes, read every response back.

Requests are bytes, not a client library's idea of a request, so that the tests can send what no
well-behaved client would: conflicting framing, bad chunk sizes, half-closed sockets, pipelines.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def exchange(port: int, pieces: list[bytes], *, gap: float = 0.0, half_close: bool = True,
             timeout: float = 5.0, expect: int | None = None, heads: list[bool] = ()) -> tuple[list[Response], bytes]:
    """Send `pieces` (with `gap` seconds between them), optionally shut the write side, and read
    until the server closes, `expect` responses arrived, or `timeout`. `heads[i]` says the i-th
    request was a HEAD (its response has no body). Returns (responses, raw)."""
    raw = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        deadline = time.monotonic() + timeout
        try:
            for i, piece in enumerate(pieces):
                if i and gap:
                    time.sleep(gap)
                sock.sendall(piece)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass    # the server refused early and closed; read what it said
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except socket.timeout:
                break
            except OSError:
                break
            if not data:
                break
            raw += data
            if expect is not None and len(parse_responses(raw, heads)[0]) >= expect:
                break
    return parse_responses(raw, heads)[0], raw


def parse_responses(raw: bytes, heads: list[bool] = ()) -> tuple[list[Response], bytes]:
    """Every complete response in `raw`; the rest (an incomplete one) is returned unparsed."""
    out: list[Response] = []
    pos = 0
    while True:
        end = raw.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        lines = raw[pos:end].decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise AssertionError(f"not an HTTP response: {raw[pos:pos + 200]!r}") from None
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
        lower = {k.lower(): v for k, v in headers}
        body_start = end + 4
        if status == 100:
            pos = body_start
            continue
        if len(out) < len(heads) and heads[len(out)] or status in (204, 304):
            body, pos = b"", body_start
        elif "chunked" in lower.get("transfer-encoding", "").lower():
            body, cursor = b"", body_start
            while True:
                eol = raw.find(b"\r\n", cursor)
                if eol < 0:
                    return out, raw[pos:]
                size = int(raw[cursor:eol].split(b";")[0], 16)
                if size == 0:
                    tail = raw.find(b"\r\n\r\n", eol)
                    if tail < 0:
                        return out, raw[pos:]
                    pos = tail + 4
                    break
                if len(raw) < eol + 2 + size + 2:
                    return out, raw[pos:]
                body += raw[eol + 2:eol + 2 + size]
                cursor = eol + 2 + size + 2
        elif "content-length" in lower:
            length = int(lower["content-length"])
            if len(raw) < body_start + length:
                return out, raw[pos:]
            body, pos = raw[body_start:body_start + length], body_start + length
        else:
            body, pos = raw[body_start:], len(raw)
        out.append(Response(status, headers, body))
    return out, raw[pos:]


def request(method: str, path: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"",
            *, length: bool = True) -> bytes:
    """One request's bytes; Content-Length is added unless `length` is False or one is given."""
    headers = list(headers or [])
    names = {k.lower() for k, _ in headers}
    lines = [f"{method} {path} HTTP/1.1".encode("latin-1")]
    if "host" not in names:
        lines.append(b"Host: fuzz")
    for name, value in headers:
        lines.append(name.encode("latin-1") + b": " + value.encode("latin-1"))
    if length and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
