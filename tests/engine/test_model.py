"""The engine computes what transformers computes, through every scheduling path."""

from __future__ import annotations

import pytest
import torch

from engine.request import SamplingParams

TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps "
        "as his father had taught him, one hundred and twelve, and lit the great lamp that warned ships "
        "away from the rocks below. Nobody had visited the island in years, but he kept the log anyway.")


def prompts(tokenizer) -> list[list[int]]:
    ids = tokenizer.encode(TEXT)
    # Different lengths (1 token to past four blocks); two share a 3-block prefix so the prefix
    # cache has something to hit when it is on.
    return [ids[:1], ids[:7], ids[:23], ids[:48], ids[:48] + tokenizer.encode(" Then"), ids[:70]]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    from engine.parity import hf_greedy as greedy

    return greedy(model, prompt, n)


@pytest.fixture(scope="module")
def reference(hf_tiny, tiny_tokenizer):
    return [hf_greedy(hf_tiny, p, 20) for p in prompts(tiny_tokenizer)]


def test_logits_match_transformers(make_engine, hf_tiny, tiny_tokenizer):
    ids = tiny_tokenizer.encode(TEXT)
    engine = make_engine(num_blocks=64)
    ours = engine.runner.logits(ids)
    with torch.no_grad():
        ref = hf_tiny(torch.tensor([ids], device=hf_tiny.device)).logits[0]
    # Same weights, same float32 maths up to summation order: the bound is 1e-3.
    assert ours.shape == ref.shape == (len(ids), 49152)
    assert (ours - ref).abs().max().item() < 1e-3


@pytest.mark.parametrize("cfg", [
    dict(),                                                          # defaults: chunked + prefix caching
    dict(enable_chunked_prefill=False),
    dict(enable_prefix_caching=False),
    dict(max_num_batched_tokens=16),                                 # every prompt split into chunks
    dict(max_num_batched_tokens=24),                                 # steps of 17..24 rows: packed GEMM path
    dict(enable_chunked_prefill=False, enable_prefix_caching=False),
], ids=["default", "no-chunked", "no-prefix", "chunks-of-16", "chunks-of-24", "neither"])
def test_greedy_batch_matches_transformers(make_engine, tiny_tokenizer, reference, cfg):
    engine = make_engine(num_blocks=128, **cfg)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    assert engine.generate(prompts(tiny_tokenizer), params) == reference
    assert engine.kv.pool.num_free_blocks == 128


@pytest.mark.parametrize("budget,blocks,min_groups", [(512, 128, 4), (24, 128, 4), (64, 12, 2)],
                         ids=["decode-steps", "mixed-steps", "under-preemption"])
def test_greedy_matches_transformers_with_decodes_in_groups(make_engine, tiny_tokenizer, reference, monkeypatch, budget,
                                                           blocks, min_groups):
    from engine import attention

    monkeypatch.setattr(attention, "GROUP_COST_SLOTS", 0)    # a group per distinct width: the most splits
    groups = []
    build = attention.AttentionMetadata.build

    def spy(*args, **kwargs):
        meta = build(*args, **kwargs)
        groups.append((len(meta.decode_groups), bool(meta.prefills)))
        return meta

    monkeypatch.setattr(attention.AttentionMetadata, "build", staticmethod(spy))
    engine = make_engine(num_blocks=blocks, max_num_batched_tokens=budget)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    assert engine.generate(prompts(tiny_tokenizer), params) == reference
    assert max(n for n, _ in groups) >= min_groups
    if blocks == 12:   # recomputed requests rejoin the groups (the pool of 12 blocks forces preemption)
        assert engine.scheduler.num_preemptions > 0
    if budget == 24:   # prompts chunked beside decodes in several groups
        assert any(n >= 2 and mixed for n, mixed in groups)


def test_greedy_identical_under_preemption(make_engine, tiny_tokenizer, reference):
    # 12 blocks hold 192 tokens; the six requests need 1+1+3+5+5+6 = 21 blocks at their longest
    # (prompt + 20 tokens), so running them together must preempt, and recompute must not change a token.
    engine = make_engine(num_blocks=12, max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    assert engine.generate(prompts(tiny_tokenizer), params) == reference
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv.pool.num_free_blocks == 12


def test_prefix_hit_gives_same_tokens(make_engine, tiny_tokenizer, reference):
    engine = make_engine(num_blocks=64)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    ps = prompts(tiny_tokenizer)
    assert engine.generate([ps[3]], params) == [reference[3]]
    hits_before = engine.kv.num_hits
    # The second run of the 48-token prompt finds its first 2 full blocks cached (the third full
    # block is skipped: at least one token must be computed to get logits) ...
    assert engine.generate([ps[3]], params) == [reference[3]]
    assert engine.kv.num_hits - hits_before == 32


def test_seeded_sampling_is_reproducible(make_engine, tiny_tokenizer):
    ids = tiny_tokenizer.encode(TEXT)[:10]
    p = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    a = make_engine(num_blocks=32).generate([ids], p)
    b = make_engine(num_blocks=32).generate([ids, ids[:3]], p)[0]
    # The same seed draws the same tokens whatever else shares the batch.
    assert a[0] == b
    unseeded = SamplingParams(max_tokens=12, temperature=5.0, ignore_eos=True)
    assert make_engine(num_blocks=32, seed=1).generate([ids], unseeded) != make_engine(num_blocks=32, seed=2).generate([ids], unseeded)


@pytest.mark.parametrize("rows", [1, 16, 17, 20, 32, 33, 100])
def test_projection_paths_agree(rows):
    from engine.model import Proj, packed_gemm_available

    if not packed_gemm_available("cpu"):
        pytest.skip("this torch has no MKL packed GEMM")
    g = torch.Generator().manual_seed(rows)
    w_t, x = torch.randn(64, 300, generator=g), torch.randn(rows, 64, generator=g)
    # Packed (17..32 rows, padded to 32) or plain, every row count gives x @ W_t. Proj takes the
    # checkpoint's (out, in) weight, as F.linear does.
    assert torch.allclose(Proj(w_t.t(), packed=True)(x), x @ w_t, atol=1e-4)


def test_prompt_tokens_counted_when_the_prefill_ends(make_engine, tiny_tokenizer):
    # As vLLM counts vllm:prompt_tokens: at a request's first token, not when it arrives (a backlog's
    # prompts would read as computed while they wait), and once, however often it is recomputed.
    engine = make_engine(num_blocks=64, max_num_batched_tokens=16)
    ids = tiny_tokenizer.encode(TEXT)[:40]
    engine.add_request("a", ids, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.num_prompt_tokens == 0         # 32 of 40 computed, no token yet
    engine.step()
    assert engine.num_prompt_tokens == 40
    while engine.has_work():
        engine.step()
    assert engine.num_prompt_tokens == 40
    # Recomputed after preemption (the pool of 12 blocks of the test above), still counted once.
    engine = make_engine(num_blocks=12, max_num_batched_tokens=64)
    ps = prompts(tiny_tokenizer)
    engine.generate(ps, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert engine.scheduler.num_preemptions > 0
    assert engine.num_prompt_tokens == sum(len(p) for p in ps)
