"""Prompt-layout advice: how much of each prompt a prefix cache can reuse, and how much more it
could reuse if one short volatile span (a request id, a timestamp, a user name near the top)
moved to the end.

Each rendered prompt is cut into content-defined chunks: lines, and within a line longer than
160 characters its sentences (". "), and within a sentence longer than that 128-character
slices. The cut points depend only on nearby text, so text shared by two prompts is cut the same
way again right after a field where they differ: the chunking re-synchronises after a volatile
field at the next line or sentence. Per chunk only a keyed hash is kept (the text is dropped at
once), and two hash tables over the last `window` prompts of a model and tenant:

- prefix keys (chunk i's key depends on every chunk before it, as an engine hashes KV blocks):
  the longest run of them found in the window is what a prefix cache can reuse, the exact prefix;
- bigram keys (a chunk and its successor): past the exact prefix, a short gap followed by a long
  run of known bigrams is text every prompt shares that sits behind a volatile span.

Everything per chunk runs in C (str.splitlines, map(hash), itertools.accumulate, dict.update);
Python loops only over the lines and over the chunks it compares, and tables forget old prompts
lazily (a last-seen sequence number per key, swept once per window).

A request "has a volatile span" when, after its exact prefix, at most `max_span_tokens`
unknown tokens are followed by at least `min_run_tokens` known ones. Token counts are
estimated from characters with a per-model ratio learned from the upstream's usage
(prompt_tokens / rendered characters); offsets are therefore estimates. The chat template's few
tokens per message are not rendered, which shifts offsets by a handful of tokens at most.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from array import array
from dataclasses import dataclass
from itertools import accumulate, count, repeat
from operator import xor

_LONG_LINE = 160                   # characters; longer lines are cut into sentences, then slices
_SLICE = 128
_TOKEN_IDS_PER_CHUNK = 16          # prompts given as token ids: fixed 16-token chunks
DEFAULT_TOKENS_PER_CHAR = 0.25     # until the upstream's usage says otherwise (English BPE)


def _keyed_hasher():
    """Python's str hash is SipHash keyed by a per-process random secret: the keyed hash we need,
    at C speed. Where PYTHONHASHSEED fixes that key, keyed BLAKE2b with a secret of our own takes
    its place (about 0.5 µs a chunk more)."""
    if sys.flags.hash_randomization and os.environ.get("PYTHONHASHSEED", "random") == "random":
        return hash
    key = secrets.token_bytes(16)

    def blake(chunk: str | bytes) -> int:
        data = chunk.encode() if isinstance(chunk, str) else chunk
        return int.from_bytes(hashlib.blake2b(data, key=key, digest_size=8).digest(), "little", signed=True)
    return blake


_hash = _keyed_hasher()


@dataclass(frozen=True)
class Chunks:
    """A prompt as keyed chunk hashes and each chunk's length (characters, or tokens for traces)."""
    hashes: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def size(self) -> int:
        return sum(self.lengths)


def _pieces(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines(True):
        if len(line) <= _LONG_LINE:
            out.append(line)
            continue
        sentences = line.split(". ")
        last = len(sentences) - 1
        for i, sentence in enumerate(sentences):
            if i < last:
                sentence += ". "
            if len(sentence) <= _LONG_LINE:
                out.append(sentence)
            else:
                out.extend(sentence[k:k + _SLICE] for k in range(0, len(sentence), _SLICE))
    return out


def chunk_text(text: str) -> Chunks:
    parts = _pieces(text)
    return Chunks(tuple(map(_hash, parts)), tuple(map(len, parts)))


def chunk_ids(ids, lengths) -> Chunks:
    """Chunks given by id already (a trace's block hash ids), with their token lengths."""
    return Chunks(tuple(_hash(str(i)) for i in ids), tuple(lengths))


def chunk_token_ids(tokens: list[int]) -> Chunks:
    # As bytes: Python's int and tuple hashes are not keyed, its str and bytes hashes are.
    n = _TOKEN_IDS_PER_CHUNK
    parts = [tokens[i:i + n] for i in range(0, len(tokens), n)]
    keys = tuple(_hash(array("q", part).tobytes()) for part in parts)
    return Chunks(keys, tuple(map(len, parts)))


def render(body: dict) -> Chunks | None:
    """The chunks of a chat or completions request body; None when it holds no prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"{m.get('role', '')}\n{content if isinstance(content, str) else ''}\n")
        return chunk_text("".join(parts)) if parts else None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return chunk_text(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return chunk_token_ids(prompt)
    return None


@dataclass(frozen=True)
class PromptReuse:
    """What one prompt shares with the window before it, in the chunks' length unit."""
    size: int
    prefix: int                        # exact prefix found in the window
    span_offset: int | None = None     # where the volatile span starts (None: no span)
    span_length: int = 0
    movable: int = 0                   # shared text behind the span: cacheable if the span moved


class PromptWindow:
    """The last `capacity` prompts of one model and tenant (capacity 0: unbounded, for offline
    analysis of a whole file). Keys map to the sequence number of the last prompt that had them;
    a key is known while that prompt is still inside the window."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._seq = 0
        self._prefixes: dict[int, int] = {}
        self._bigrams: dict[int, int] = {}

    def analyse_and_add(self, chunks: Chunks, max_span: float, min_run: float) -> PromptReuse:
        hashes = chunks.hashes
        # Prefix key i: XOR of (position, chunk) hashes up to i, so it names the whole sequence.
        prefixes = list(accumulate(map(hash, zip(count(), hashes)), xor))
        bigrams = list(map(hash, zip(hashes, hashes[1:])))
        # Known: last seen by a prompt with a sequence number above `oldest` (missing keys: -1).
        oldest = max(0, self._seq - self.capacity) if self.capacity else 0
        result = self._analyse(prefixes, bigrams, chunks.lengths, max_span, min_run, oldest)
        self._seq += 1
        self._prefixes.update(zip(prefixes, repeat(self._seq)))
        self._bigrams.update(zip(bigrams, repeat(self._seq)))
        if self.capacity and self._seq % self.capacity == 0:
            keep = self._seq - self.capacity
            self._prefixes = {k: s for k, s in self._prefixes.items() if s > keep}
            self._bigrams = {k: s for k, s in self._bigrams.items() if s > keep}
        return result

    def _analyse(self, prefixes, bigrams, lengths, max_span, min_run, oldest) -> PromptReuse:
        get_prefix, get_bigram = self._prefixes.get, self._bigrams.get
        n, e = len(prefixes), 0
        # Known prefixes are closed under shortening (a prompt adds all of its own), so the exact
        # prefix is where they stop: binary search.
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if get_prefix(prefixes[mid], -1) > oldest:
                lo = mid + 1
            else:
                hi = mid
        e = lo
        size = sum(lengths)
        prefix = sum(lengths[:e])
        if e >= n - 1:
            return PromptReuse(size, prefix)
        gap, r = 0, e
        while r < n - 1 and get_bigram(bigrams[r], -1) <= oldest:
            gap += lengths[r]
            if gap > max_span:
                return PromptReuse(size, prefix)
            r += 1
        j = r
        while j < n - 1 and get_bigram(bigrams[j], -1) > oldest:
            j += 1
        run = sum(lengths[r:j + 1]) if j > r else 0
        if run < min_run:
            return PromptReuse(size, prefix)
        return PromptReuse(size, prefix, prefix, gap, run)
