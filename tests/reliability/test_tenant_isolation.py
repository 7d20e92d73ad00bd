"""Tenants never share KV blocks, seen in the engine's prefix-cache counters and in time to first
token, through the sidecar (which forwards the `x-tenant` header; the bundled engine salts its
block hashes with it).

Per trial a fresh ~1,200-token prompt: tenant A sends it (filling the cache for A), then in
alternating order tenant B sends the same prompt (cross), A sends it again (same) and B sends a
fresh prompt (cold). Expected: cross hits 0 blocks and its TTFT is indistinguishable from cold
(Mann-Whitney U, two-sided p > 0.01, medians within 30 %), while same hits nearly every block and
is clearly faster (p < 0.001).
"""

from __future__ import annotations

import random
import statistics
import time

import httpx
import pytest
from scipy.stats import mannwhitneyu

from tests.reliability.stack import Engine
from tests.sidecar.conftest import SidecarThread

TRIALS = 12
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def _prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(1200))


def _ttft(client: httpx.Client, url: str, prompt: str, tenant: str) -> float:
    start = time.perf_counter()
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "stream": True}
    with client.stream("POST", url + "/v1/completions", json=body, headers={"x-tenant": tenant}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"text": ""' not in line:
                return time.perf_counter() - start
    raise AssertionError("no token")


def _hits(engine: Engine) -> float:
    text = httpx.get(engine.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


@pytest.mark.slow
def test_tenants_share_no_kv_blocks_and_no_cache_timing():
    engine = Engine()
    runner = SidecarThread()
    try:
        live = runner.start(engine.url, models=("tiny",))
        times = {"cross": [], "same": [], "cold": []}
        hits = {"cross": 0.0, "same": 0.0}
        with httpx.Client(timeout=60) as client:
            _ttft(client, live.url, _prompt(-1), "warm-up")       # first-request costs out of the way
            for trial in range(TRIALS):
                prompt = _prompt(trial)
                _ttft(client, live.url, prompt, "A")
                order = ["cross", "same", "cold"] if trial % 2 == 0 else ["cold", "same", "cross"]
                for kind in order:
                    before = _hits(engine)
                    if kind == "cross":
                        times[kind].append(_ttft(client, live.url, prompt, "B"))
                    elif kind == "same":
                        times[kind].append(_ttft(client, live.url, prompt, "A"))
                    else:
                        times[kind].append(_ttft(client, live.url, _prompt(1000 + trial), "B"))
                    if kind in hits:
                        hits[kind] += _hits(engine) - before
        median = {k: statistics.median(v) for k, v in times.items()}
        cross_p = mannwhitneyu(times["cross"], times["cold"], alternative="two-sided").pvalue
        same_p = mannwhitneyu(times["same"], times["cold"], alternative="two-sided").pvalue
        print(f"\nTTFT medians {median}, cross vs cold p={cross_p:.3f}, same vs cold p={same_p:.2e}, hits {hits}")
        assert hits["cross"] == 0, "tenant B reused blocks tenant A computed"
        assert hits["same"] >= TRIALS * 1000, hits        # ~1,200 tokens a prompt, full blocks cached
        assert cross_p > 0.01 and abs(median["cross"] - median["cold"]) < 0.3 * median["cold"], (cross_p, median)
        assert same_p < 0.001 and median["same"] < 0.6 * median["cold"], (same_p, median)
    finally:
        runner.close()
        engine.stop()
