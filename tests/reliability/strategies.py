"""Hypothesis strategies for the HTTP fuzzer: requests the OpenAI API never sends.

A `Case` is the bytes to send plus what a correct proxy must do with them. Well-formed HTTP with
odd content must be answered (never 5xx), forwarded once and counted once when measured;
malformed framing must be refused with 400 and forwarded nowhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

from tests.reliability.conftest import CANARY_PROMPT, CANARY_TOKEN
from tests.reliability.rawhttp import request

MEASURED_PATHS = ("/v1/chat/completions", "/v1/completions", "/openai/v1/chat/completions", "/completions")
# Headers that frame or route the request: the framing strategies below exercise them on purpose.
FRAMING = {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te", "trailer"}
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass
class Case:
    pieces: list[bytes]
    requests: int            # well-formed requests in the bytes (responses expected), 0 for malformed
    measured: int            # of them, POSTs to a completions path (counted once each)
    must_refuse: bool = False  # framing the proxy must refuse with 400, forwarding nothing
    gap: float = 0.0
    heads: tuple[bool, ...] = ()   # which requests are HEADs (their answers have no body)

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)


token = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~",
                min_size=1, max_size=24)
header_name = token.filter(lambda n: n.lower() not in FRAMING)
# Field values: visible ASCII, spaces and tabs inside, obs-text (0x80-0xFF) as RFC 9110 allows.
header_value = st.text(alphabet=st.characters(codec="latin-1", exclude_characters="\r\n\x00",
                                              exclude_categories=("Cc",)) | st.sampled_from(" \t"),
                       max_size=64).map(str.strip)
segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~", min_size=1, max_size=12)
odd_path = st.lists(segment, min_size=1, max_size=4).map(lambda s: "/" + "/".join(s))
query = st.none() | st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789=&%+", max_size=20)

json_leaf = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
             | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
# The fields the sidecar reads, with values of every type, next to the ones it never reads.
openai_like = st.fixed_dictionaries(
    {},
    optional={"model": json_value | st.sampled_from(["m", "other-model", ""]) | st.text(max_size=300),
              "stream": json_value | st.just(True),
              "stream_options": json_value | st.just({"include_usage": True}),
              "max_tokens": json_value, "max_completion_tokens": json_value,
              "messages": json_value | st.just([{"role": "user", "content": CANARY_PROMPT}]),
              "prompt": json_value | st.just(CANARY_PROMPT)})


def _dumps(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


body = st.one_of(
    openai_like.map(_dumps),
    json_value.map(_dumps),
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),     # depth bombs
    st.integers(min_value=1, max_value=50_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.just(b'{"model": "m", "stream": true, "max_tokens": ' + b"9" * 5000 + b"}"),     # > 4,300 digits
    st.just(b'{"model": "\xff\xfe", "prompt": "x"}'),                                    # not UTF-8
    st.just(b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}, "prompt": "'
            + CANARY_PROMPT.encode() + b'"}'),
)


@st.composite
def well_formed(draw) -> tuple[bytes, bool, bool]:
    """One valid HTTP/1.1 request with odd content: (bytes, measured?, HEAD?)."""
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
    path = draw(st.sampled_from(MEASURED_PATHS) | odd_path)
    q = draw(query)
    target = path + ("?" + q if q else "")
    headers = draw(st.lists(st.tuples(header_name, header_value), max_size=6))
    if draw(st.booleans()):
        headers.append(("Authorization", f"Bearer {CANARY_TOKEN}"))
    if draw(st.booleans()):
        headers.append(("x-slo-class", draw(header_value)))
    payload = draw(body) if method not in ("GET", "HEAD") or draw(st.booleans()) else b""
    chunked = method != "HEAD" and draw(st.booleans())
    if chunked:
        sizes = draw(st.lists(st.integers(1, 64), max_size=4))
        parts, pos = [], 0
        for size in sizes:
            if pos >= len(payload):
                break
            piece = payload[pos:pos + size]
            ext = draw(st.sampled_from([b"", b";ext=1", b";x"]))
            parts.append(b"%x%s\r\n%s\r\n" % (len(piece), ext, piece))
            pos += size
        if pos < len(payload):
            parts.append(b"%x\r\n%s\r\n" % (len(payload) - pos, payload[pos:]))
        data = request(method, target, headers + [("Transfer-Encoding", "chunked")], b"".join(parts) + b"0\r\n\r\n")
    else:
        data = request(method, target, headers, payload)
    return data, method == "POST" and path.endswith("/completions"), method == "HEAD"


@st.composite
def pipelined(draw) -> Case:
    """1-4 well-formed requests in one write, sent whole or cut at random points with small gaps."""
    reqs = draw(st.lists(well_formed(), min_size=1, max_size=4))
    data = b"".join(r for r, _, _ in reqs)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
    pieces = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)]) if b > a]
    gap = draw(st.sampled_from([0.0, 0.0, 0.01, 0.05]))
    return Case(pieces, len(reqs), sum(m for _, m, _ in reqs), gap=gap, heads=tuple(h for _, _, h in reqs))


P = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
BODY = b'{"model": "m", "prompt": "hi"}'
# Framing every HTTP/1.1 proxy must refuse (RFC 9112 6.1, 6.3): each hides a second request
# that an upstream reading the bytes differently would see.
MUST_REFUSE = [
    P + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n" + SMUGGLED,
    P + b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}" + SMUGGLED,
    P + b"Content-Length: -1\r\n\r\n" + SMUGGLED,
    P + b"Content-Length: +2\r\n\r\n{}" + SMUGGLED,
    P + b"Content-Length: 0x2\r\n\r\n{}" + SMUGGLED,
    P + b"Content-Length: 2, 2\r\n\r\n{}" + SMUGGLED,
    P + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: chunked\r\n\r\n2;\x01ext\r\n{}\r\n0\r\n\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + SMUGGLED,
    P + b"Transfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    P + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    P + b"Content-Length : 2\r\n\r\n{}" + SMUGGLED,
    P + b"X-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    P + b"X-Nul: a\x00b\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED,
    P + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}" + SMUGGLED,
    b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)),    # a TLS ClientHello
]


@st.composite
def must_refuse(draw) -> Case:
    data = draw(st.sampled_from(MUST_REFUSE))
    cut = draw(st.integers(0, len(data)))
    pieces = [p for p in (data[:cut], data[cut:]) if p]
    return Case(pieces, 0, 0, must_refuse=True, gap=draw(st.sampled_from([0.0, 0.02])))


cases = st.one_of(pipelined(), pipelined(), pipelined(), must_refuse())
