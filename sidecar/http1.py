"""HTTP/1.1 request parsing for the sidecar's own server (`sidecar.fastserver`): strict, incremental.

Strict because the sidecar sits in front of another HTTP server: any framing two parsers could
read differently (Content-Length beside Transfer-Encoding, two lengths, a length with a sign,
an obs-folded line, a bare LF, a chunk size that is not plain hex) is refused with 400 rather
than guessed at, so no request can hide behind another (RFC 9112 6.1, 6.3, 11.2).

`parse_head(buf)` returns a `RequestHead` once the head is complete; `ChunkedBody` and
`LengthBody` decode a body from the bytes that follow. Both raise `HttpError(status, reason)`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

MAX_HEAD_BYTES = 64 * 1024      # request line and headers together; past it 431
MAX_HEADERS = 128
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Inside a line: any control character but HT, including CR and LF on their own (the split on
# CRLF already removed the ones that end lines).
_BAD_IN_LINE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# In a head still arriving: a control character that can never be valid, or a bare LF.
_BAD_PARTIAL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|(?<!\r)\n")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CHUNK_EXT = re.compile(rb"(;[\x20\x09!#$%&'*+\-.^_`|~0-9A-Za-z=\"]*)*")


class HttpError(Exception):
    """A request the server refuses before any handler sees it (or a body it cannot decode)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class RequestHead:
    __slots__ = ("method", "raw_path", "path", "version", "headers", "content_length", "chunked",
                 "keep_alive", "expect_continue")

    def __init__(self, method: str, raw_path: str, path: str, version: tuple[int, int], headers: CIMultiDictProxy,
                 content_length: int | None, chunked: bool, keep_alive: bool, expect_continue: bool):
        self.method, self.raw_path, self.path, self.version = method, raw_path, path, version
        self.headers, self.content_length, self.chunked = headers, content_length, chunked
        self.keep_alive, self.expect_continue = keep_alive, expect_continue


def check_partial(buf: bytes) -> None:
    """Refuse a head that can already be seen to be wrong (a TLS hello, bare LFs) instead of
    waiting for a CRLF CRLF that may never come; and one that grew past the limit."""
    if _BAD_PARTIAL.search(buf, 0, MAX_HEAD_BYTES):
        raise HttpError(400, "invalid character in the request head")
    space = buf.find(b" ", 0, 32)
    method = buf[:space] if space >= 0 else buf[:32]
    if method and not _TOKEN.fullmatch(method):
        raise HttpError(400, "invalid method")
    if space < 0 and len(buf) >= 32:
        raise HttpError(400, "invalid method")
    if len(buf) > MAX_HEAD_BYTES:
        raise HttpError(431, "request header fields too large")


def parse_head(buf: bytes, start: int = 0) -> tuple[RequestHead | None, int]:
    """(head, offset just past it), or (None, start) while the head is incomplete."""
    end = buf.find(b"\r\n\r\n", start)
    if end < 0:
        check_partial(buf[start:])
        return None, start
    if end - start > MAX_HEAD_BYTES:
        raise HttpError(431, "request header fields too large")
    lines = buf[start:end].split(b"\r\n")
    method, raw_path, version = _request_line(lines[0])
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "too many header fields")
    headers: CIMultiDict = CIMultiDict()
    lengths: list[bytes] = []
    codings: list[bytes] = []
    connection = expect = b""
    for line in lines[1:]:
        colon = line.find(b":")
        if colon <= 0 or not _TOKEN.fullmatch(line, 0, colon):
            # Covers obs-fold (a line starting with whitespace) and "Name : value".
            raise HttpError(400, "invalid header line")
        if _BAD_IN_LINE.search(line, colon):
            raise HttpError(400, "invalid character in a header value")
        name = line[:colon]
        value = line[colon + 1:].strip(b" \t")
        low = name.lower()
        if low == b"content-length":
            lengths.append(value)
        elif low == b"transfer-encoding":
            codings.append(value)
        elif low == b"connection":
            connection += b"," + value.lower()
        elif low == b"expect":
            expect = value.lower()
        # aiohttp's decoding, which sidecar.upstream re-encodes to the client's exact bytes.
        headers.add(name.decode("ascii"), value.decode("utf-8", "surrogateescape"))
    content_length = None
    if lengths:
        if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            raise HttpError(400, "invalid Content-Length")
        content_length = int(lengths[0])
    chunked = False
    if codings:
        if len(codings) > 1 or codings[0].lower() != b"chunked" or content_length is not None or version < (1, 1):
            raise HttpError(400, "unsupported Transfer-Encoding")
        chunked = True
    tokens = {t.strip() for t in connection.split(b",")}
    keep_alive = version >= (1, 1) and b"close" not in tokens
    path = _path(raw_path)
    head = RequestHead(method, raw_path, path, version, CIMultiDictProxy(headers), content_length, chunked,
                       keep_alive, expect == b"100-continue" and version >= (1, 1))
    return head, end + 4


def _request_line(line: bytes) -> tuple[str, str, tuple[int, int]]:
    parts = line.split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise HttpError(400, "invalid request line")
    if parts[2] == b"HTTP/1.1":
        version = (1, 1)
    elif parts[2] == b"HTTP/1.0":
        version = (1, 0)
    else:
        raise HttpError(400, "unsupported HTTP version")
    return parts[0].decode("ascii"), parts[1].decode("ascii"), version


def _path(target: str) -> str:
    if target.startswith("/"):
        return unquote(target.split("?", 1)[0])
    if target.startswith(("http://", "https://")):     # absolute-form, as a client talking to a proxy sends
        return unquote(urlsplit(target).path) or "/"
    if target == "*":
        return "*"
    raise HttpError(400, "invalid request target")


def origin_form(target: str) -> str:
    """The path and query to send upstream (absolute-form targets lose their scheme and host)."""
    if target.startswith(("http://", "https://")):
        parts = urlsplit(target)
        return (parts.path or "/") + ("?" + parts.query if parts.query else "")
    return target


class LengthBody:
    """A body of Content-Length bytes."""

    def __init__(self, length: int):
        self.remaining = length
        self.done = length == 0

    def feed(self, buf: bytes, pos: int, out: list[bytes]) -> int:
        """Decode from buf[pos:] into `out`; returns the offset of the first byte not consumed."""
        take = min(self.remaining, len(buf) - pos)
        if take:
            out.append(buf[pos:pos + take])
            self.remaining -= take
        self.done = self.remaining == 0
        return pos + take


class ChunkedBody:
    """A chunked body (RFC 9112 7.1), trailers read and dropped."""

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self):
        self.state = self._SIZE
        self.remaining = 0
        self.done = False

    def feed(self, buf: bytes, pos: int, out: list[bytes]) -> int:
        end = len(buf)
        while pos < end and not self.done:
            state = self.state
            if state == self._DATA:
                take = min(self.remaining, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.state = self._DATA_END
            elif state == self._DATA_END:
                if end - pos < 2:
                    if buf[pos:pos + 1] != b"\r":
                        raise HttpError(400, "chunk data not followed by CRLF")
                    return pos
                if buf[pos:pos + 2] != b"\r\n":
                    raise HttpError(400, "chunk data not followed by CRLF")
                pos += 2
                self.state = self._SIZE
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > 4096 or _BAD_PARTIAL.search(buf, pos):
                        raise HttpError(400, "invalid chunk size line")
                    return pos
                line = buf[pos:eol]
                pos = eol + 2
                if state == self._TRAILER:
                    if not line:
                        self.done = True
                    elif _BAD_IN_LINE.search(line):
                        raise HttpError(400, "invalid trailer line")
                    continue
                size, _, ext = line.partition(b";")
                if not _HEX.fullmatch(size) or (ext and not _CHUNK_EXT.fullmatch(b";" + ext)):
                    raise HttpError(400, "invalid chunk size")
                self.remaining = int(size, 16)
                self.state = self._DATA if self.remaining else self._TRAILER
        return pos
