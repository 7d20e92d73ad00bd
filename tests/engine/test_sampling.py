"""Sampling parameters and finishing rules: top-k/top-p, EOS, ignore_eos, stop tokens, max_tokens."""

from __future__ import annotations

import pytest
import torch

from engine.request import SamplingParams
from engine.sampler import Sampler


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0)) * 3
    greedy = logits.argmax(-1).tolist()
    s = Sampler(seed=0)
    hot = dict(max_tokens=1, temperature=5.0)
    # Only the best token survives either filter, however hot the temperature.
    assert s.sample(logits, list("abcd"), [SamplingParams(top_k=1, **hot)] * 4) == greedy
    assert s.sample(logits, list("abcd"), [SamplingParams(top_p=1e-6, **hot)] * 4) == greedy


def test_tiny_temperature_is_greedy_not_nan():
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(2)) * 50
    # logits / 1e-30 would overflow to inf and the softmax to NaN; it must sample the argmax.
    assert Sampler().sample(logits, ["a", "b"], [SamplingParams(temperature=1e-30)] * 2) == logits.argmax(-1).tolist()


def test_top_k_keeps_draws_inside_the_k_best():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(1))
    top5 = set(torch.topk(logits[0], 5).indices.tolist())
    s = Sampler(seed=3)
    draws = {s.sample(logits, ["r"], [SamplingParams(max_tokens=1, temperature=10.0, top_k=5)])[0] for _ in range(200)}
    # At temperature 10 the 5 survivors are near uniform: 200 draws hit all of them and nothing else.
    assert draws == top5


def _greedy(make_engine, tokenizer, **params):
    engine = make_engine(num_blocks=32)
    ids = tokenizer.encode("The keeper climbed the stairs")
    engine.add_request("r", ids, SamplingParams(temperature=0, **params), detokenize=False)
    outs = []
    while engine.has_work():
        outs.extend(engine.step())
    return engine, [o.new_token_ids[0] for o in outs], outs[-1].finish_reason


def test_eos_stops_unless_ignored(make_engine, tiny_tokenizer):
    _, free_run, reason = _greedy(make_engine, tiny_tokenizer, max_tokens=8, ignore_eos=True)
    assert reason == "length" and len(free_run) == 8
    eos = free_run[3]
    first = free_run.index(eos)
    engine = make_engine(num_blocks=32)
    engine.eos_ids = {eos}   # pretend the 4th greedy token is the model's EOS
    ids = tiny_tokenizer.encode("The keeper climbed the stairs")
    engine.add_request("r", ids, SamplingParams(max_tokens=8, temperature=0), detokenize=False)
    outs = []
    while engine.has_work():
        outs.extend(engine.step())
    # Generation ends on the first EOS, which is counted, with finish_reason "stop".
    assert [o.new_token_ids[0] for o in outs] == free_run[: first + 1] and outs[-1].finish_reason == "stop"
    assert engine.kv.pool.num_free_blocks == 32


def test_stop_token_ids_end_the_request(make_engine, tiny_tokenizer):
    _, free_run, _ = _greedy(make_engine, tiny_tokenizer, max_tokens=8, ignore_eos=True)
    target = free_run[5]
    _, run, reason = _greedy(make_engine, tiny_tokenizer, max_tokens=8, ignore_eos=True, stop_token_ids=[target])
    assert run == free_run[: free_run.index(target) + 1] and reason == "stop"


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-0.1), dict(top_p=0.0), dict(top_k=-2),
                                 dict(seed=2**64), dict(stop_token_ids=["2"])])
def test_bad_sampling_params_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_a_top_p_below_float32_resolution_keeps_the_most_likely_token():
    # Found by schemathesis: top_p=5e-324 rounds to 0 in float32 and used to drop every token,
    # so torch.multinomial raised and the engine step failed for the whole batch.
    logits = torch.tensor([[0.0, 3.0, 1.0, -2.0]])
    for top_p in (5e-324, 1e-45):
        assert Sampler().sample(logits, ["r"], [SamplingParams(max_tokens=1, top_p=top_p)]) == [1]


def test_queue_time_counts_from_when_the_server_received_the_request(make_engine, tiny_tokenizer):
    # vLLM stamps arrival in its frontend, so a request that came in while a step ran has that
    # step's rest in its queue time; the engine thread only sees it between steps.
    import time

    engine = make_engine(num_blocks=32)
    ids = tiny_tokenizer.encode("The keeper climbed the stairs")
    received = time.monotonic() - 0.25
    engine.add_request("r", ids, SamplingParams(max_tokens=2, temperature=0), detokenize=False,
                       arrival_time=received)
    outs = []
    while engine.has_work():
        outs.extend(engine.step())
    times = outs[-1].times
    assert times is not None and times.queue >= 0.25
    # A stamp from the future (a caller's clock error) never makes the queue time negative.
    engine.add_request("s", ids, SamplingParams(max_tokens=2, temperature=0), detokenize=False,
                       arrival_time=time.monotonic() + 60)
    outs = []
    while engine.has_work():
        outs.extend(engine.step())
    assert 0 <= outs[-1].times.queue < 5
