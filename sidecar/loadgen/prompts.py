"""Prompts synthesised to exact token counts, with shared prefixes where the trace says so.

With the target model's tokenizer we pick words that are exactly one token when preceded by a
space (" the", " river", ...). Byte-level BPE splits text at spaces before merging, so a prompt of
n such words is exactly n tokens, and a block of words means the same tokens wherever it appears:
two prompts that start with the same blocks share a token-exact prefix, which is what a prefix
cache keys on. Without a tokenizer the same words are used and counts are approximate (most
English BPE vocabularies hold these words as single tokens too).
"""

from __future__ import annotations

import random
import re
import zlib
from pathlib import Path

from sidecar.loadgen.workload import PlannedRequest

# Fallback pool: short, very common English words (single tokens in GPT-2-style vocabularies).
_COMMON = ("the of and to in is for on that with as by at from this be are was it an or not have "
           "one all new more can will about which their time has also other if two into first may "
           "after only over such most made used some these many where year city work life world "
           "people state part found under water known small large early during would later since "
           "form house three high family number team name river music local based great line game").split()

_WORD = re.compile(r"^[a-z]{3,9}$")


class PromptFactory:
    """Builds prompt text of an exact token length; `exact` says whether counts are guaranteed."""

    def __init__(self, tokenizer_path: str | Path | None = None, block_tokens: int = 512, seed: int = 0):
        self.block_tokens = max(1, block_tokens)
        self.seed = seed
        self.words = list(_COMMON)
        self.exact = False
        if tokenizer_path is not None:
            self.words = _single_token_words(Path(tokenizer_path))
            self.exact = True

    def _words(self, n: int, key: tuple) -> list[str]:
        # crc32, not hash(): str hashing is salted per process and runs must be reproducible.
        rng = random.Random(zlib.crc32(repr((self.seed,) + key).encode()))
        return rng.choices(self.words, k=n)

    def prompt(self, request: PlannedRequest, index: int) -> str:
        """Text of `request.input_tokens` tokens; its first blocks follow `request.hash_ids`."""
        n = request.input_tokens
        words: list[str] = []
        for hash_id in request.hash_ids:
            if len(words) + self.block_tokens > n:
                break
            words += self._words(self.block_tokens, ("block", hash_id))
        # The remainder is unique to this request (index), so only declared prefixes are shared.
        words += self._words(n - len(words), ("tail", index))
        return "".join(" " + w for w in words)


def _single_token_words(path: Path) -> list[str]:
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ValueError(f"tokenizer file {path} not found (give a tokenizer.json with --tokenizer)")
    tok = Tokenizer.from_file(str(path))
    words = []
    for piece, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        text = tok.decode([tok.token_to_id(piece)])
        if text.startswith(" ") and _WORD.match(text[1:]):
            word = text[1:]
            # Keep only words that really encode to one token after a space, in context.
            if len(tok.encode(" " + word + " " + word, add_special_tokens=False).ids) == 2:
                words.append(word)
        if len(words) >= 2000:
            break
    if len(words) < 50:
        raise ValueError(f"tokenizer {path} has too few single-token words ({len(words)}) to build prompts")
    return words
