"""End to end: `goodput load` machinery against the bundled engine (tiny model).

The Mooncake replay must produce exactly the prefix sharing its hash ids imply, as counted by the
engine's own `vllm:prefix_cache_hits_total`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import pytest

from goodput_cli import promtext
from tests.support import TRACES, goodput_command

pytest.importorskip("engine.cli")
pytest.importorskip("sidecar.timing")

MOONCAKE = TRACES / "mooncake_conversation.jsonl"
BLOCK = 32           # tokens per Mooncake hash block after scaling (512 → 32: a multiple of 16)
ENGINE_BLOCK = 16    # the engine's KV block size (its default)


@pytest.fixture
def engine(start_server, port):
    server = start_server(goodput_command("engine", "serve", "--model", "tiny", "--port", str(port)),
                          f"http://127.0.0.1:{port}/health", timeout=120, name="engine")
    return f"http://127.0.0.1:{port}"


def _tokenizer_file():
    from goodput_cli.demo import tokenizer_file

    return tokenizer_file("tiny")


def _metric(url: str, name: str) -> float:
    return promtext.total(promtext.parse(httpx.get(f"{url}/metrics").text), name)


def expected_hits(requests, bos: int) -> int:
    """Prefix-cache hit tokens a paged engine must report when `requests` run one after another.

    A request reuses its leading hash blocks whose whole chain (h1..hk) an earlier request had:
    chained hashing means block k is the same only if every block before it is. The engine counts
    whole 16-token blocks of the prompt (plus `bos` leading token), and must compute at least the
    prompt's last token, so a prompt that is all cached gives back its last block.
    """
    seen: set[tuple[int, ...]] = set()
    total = 0
    for r in requests:
        n = r.input_tokens + bos
        chain = r.hash_ids[: r.input_tokens // BLOCK]     # hash blocks fully inside the prompt
        k = 0
        while k < len(chain) and chain[: k + 1] in seen:
            k += 1
        hit = (bos + k * BLOCK) // ENGINE_BLOCK * ENGINE_BLOCK if k else 0
        if hit >= n:
            hit -= ENGINE_BLOCK
        total += hit
        seen.update(chain[:i] for i in range(1, len(chain) + 1))
    return total


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared/traces not present")
def test_mooncake_replay_reproduces_prefix_sharing(engine):
    from sidecar.loadgen.prompts import PromptFactory
    from sidecar.loadgen.runner import LoadConfig, run_load
    from sidecar.loadgen.traces import read_trace
    from sidecar.slo import SloClass

    # The first 40 requests of the trace share a system-prompt block (hash id 0) and some share more.
    reqs = read_trace(MOONCAKE)[:40]
    reqs = [replace(r, input_tokens=max(1, r.input_tokens * BLOCK // 512), output_tokens=2) for r in reqs]
    prompts = PromptFactory(_tokenizer_file(), block_tokens=BLOCK)
    cfg = LoadConfig(base_url=engine, model="tiny", slo=SloClass("t", ttft=60, tpot=60))
    before = _metric(engine, "vllm:prefix_cache_hits_total")
    usage = []
    for i, r in enumerate(reqs):
        # One at a time, so every earlier prompt is cached before the next arrives.
        records, _ = asyncio.run(run_load(cfg, [replace(r, arrival=0.0)], _Indexed(prompts, i)))
        assert records[0].outcome == "good", records[0].error
        usage.append(records[0].usage_input_tokens)
    hits = _metric(engine, "vllm:prefix_cache_hits_total") - before
    # Prompts are token-exact (single-token words), plus any BOS the engine prepends.
    extra = usage[0] - reqs[0].input_tokens
    assert all(u - r.input_tokens == extra for u, r in zip(usage, reqs))
    assert extra in (0, 1)
    expected = expected_hits(reqs, bos=extra)
    assert expected > 0, "the slice must contain shared prefixes for this test to mean anything"
    print("prefix-cache hit tokens", hits, "expected", expected, "BOS", extra)
    assert hits == expected, (hits, expected)


class _Indexed:
    """A PromptFactory view that builds request `index`'s prompt (tails stay unique per request)."""

    def __init__(self, factory, index):
        self.factory, self.index = factory, index

    def prompt(self, request, _):
        return self.factory.prompt(request, self.index)
