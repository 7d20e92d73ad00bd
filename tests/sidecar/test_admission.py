"""The goodput guard (sidecar/admission.py) in front of an engine-like scripted upstream.

The upstream prefills one prompt at a time at PREFILL tokens/s in arrival order (prompt tokens =
characters / 4), so it serves about 1 / (tokens per prompt / PREFILL) requests a second and a
queue builds past that, exactly as in an engine at its knee; each decoding stream also slows every
token gap a little. The load is the real load generator (open loop, Poisson, fixed seed).
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from sidecar.admission import ServiceEstimate, _threshold, prompt_chars
from sidecar.config import SloConfig, parse_slo_config
from sidecar.loadgen.prompts import PromptFactory
from sidecar.loadgen.runner import LoadConfig, run_load
from sidecar.loadgen.workload import poisson_arrivals, synthetic_workload
from sidecar.slo import SloClass
from sidecar.timing import RequestTiming
from tests.sidecar.conftest import upstream_command
from tests.support import ServerProcess, free_port

PREFILL = 2000.0          # upstream prompt tokens/s
PROMPT_WORDS = 100        # ~550 characters -> ~137 upstream tokens -> ~69 ms of prefill: ~14 req/s capacity
TTFT = 0.5


@pytest.fixture(scope="module")
def engine_like():
    port = free_port()
    server = ServerProcess(upstream_command(port, "--ttft", "0.005", "--itl", "0.01", "--prefill-rate", str(PREFILL),
                                            "--itl-per-seq", "0.0005"),
                           f"http://127.0.0.1:{port}/health", timeout=30, name="engine-like-upstream")
    yield f"http://127.0.0.1:{port}"
    server.stop()


def slo_config(*classes: dict) -> SloConfig:
    return parse_slo_config({"classes": list(classes), "rules": [{"header": "x-slo-class"}]})


def load(url: str, rate: float, count: int, seed: int, slo_class: str | None = None) -> list:
    """Open-loop Poisson load through the sidecar; the records, in order."""
    return asyncio.run(_load(url, [(rate, count, seed, slo_class)]))[0]


async def _load(url: str, streams: list[tuple], ttft: float = TTFT) -> list[list]:
    async def one(rate, count, seed, slo_class):
        reqs = synthetic_workload(poisson_arrivals(rate, count, seed), PROMPT_WORDS, 4, seed=seed)
        cfg = LoadConfig(base_url=url, model="scripted", slo=SloClass("load", ttft=ttft, tpot=1.0),
                         headers={"x-slo-class": slo_class} if slo_class else {})
        records, _ = await run_load(cfg, reqs, PromptFactory(None, seed=seed))
        return records
    return await asyncio.gather(*(one(*s) for s in streams))


def warm(live, slo_class: str | None = None, may_shed: bool = False) -> None:
    """Enough measured requests at a third of capacity for the guard to have learned the engine."""
    records = load(live.url, 5.0, 20, seed=99, slo_class=slo_class)
    assert may_shed or [r.outcome for r in records].count("shed") == 0
    assert live.app.admission.estimate.samples >= 16


def outcomes(live, slo_class: str) -> dict[str, float]:
    return {o: live.value("goodput_requests_total", model="scripted", slo_class=slo_class, outcome=o)
            for o in ("good", "slo_violated", "error", "cancelled", "shed")}


# ---- the estimate and the thresholds, exactly ---------------------------------------------------

def test_estimate_recovers_prefill_rate_and_step_time():
    est = ServiceEstimate()
    # A replica with step(B) = 10 ms + 2 ms x B, 1,000 prompt tokens/s with nothing decoding, and
    # 20 us more per queued token for every request decoding meanwhile:
    # TTFT = tokens x (1 ms + 20 us x mean batch) + step(batch).
    for i in range(40):
        batch, ahead, mean = i % 7, 50 + 37 * (i % 11), (i % 7) + (i % 5) / 2
        step = 0.010 + 0.002 * (batch + 1)
        ttft = ahead * (0.001 + 0.00002 * mean) + 0.010 + 0.002 * batch
        est.observe_decode(step, batch + 1)
        est.observe_ttft(ttft, ahead, mean, batch)
    assert est.step_time(5) == pytest.approx(0.020, rel=1e-6)
    assert est.prefill_rate == pytest.approx(1000, rel=1e-3)
    assert est.predict(500, 3.0, 2) == pytest.approx(500 * 0.00106 + 0.014, rel=1e-3)


def test_lower_priority_classes_shed_at_a_lower_predicted_ttft():
    high = SloClass("high", ttft=1.0, tpot=0.1, admission=True, admission_margin=0.2, priority=2)
    mid = SloClass("mid", ttft=4.0, tpot=0.1, admission=True, priority=1)
    low = SloClass("low", ttft=0.3, tpot=0.1, admission=True, admission_margin=0.0, priority=0)
    classes = (high, mid, low)
    assert _threshold(high, classes) == pytest.approx(0.8)        # its own objective less 20 %
    assert _threshold(mid, classes) == pytest.approx(0.4)         # half of high's 0.8 s: keeps room for it
    assert _threshold(low, classes) == pytest.approx(0.2)         # half of mid's, tighter than its own 0.3 s
    # A noisy engine widens the learned headroom: high sheds earlier, and those below earlier still.
    assert _threshold(high, classes, learned_headroom=0.5) == pytest.approx(0.5)
    assert _threshold(mid, classes, learned_headroom=0.5) == pytest.approx(0.25)
    assert _threshold(low, classes, learned_headroom=0.5) < _threshold(mid, classes, learned_headroom=0.5)


def test_recent_under_prediction_widens_the_headroom_up_to_a_cap():
    from sidecar.admission import Admission, Ticket

    config = slo_config({"name": "a", "ttft": 1.0, "tpot": 1.0, "admission": True})
    guard = Admission(config)
    assert guard._thresholds["a"] == pytest.approx(0.8)          # the margin alone: 1 s less 20 %
    for i in range(100):
        # Measured TTFT 0.3 s over the prediction for one in four: p90 of the misses is 0.3 s.
        predicted, miss = 0.4, (0.3 if i % 4 == 0 else -0.05)
        ticket = Ticket(True, predicted, 0.8, tokens_ahead=100, timer=None, stream=True)
        guard._in_flight[id(ticket)] = ticket
        ticket.learned = True
        timing = RequestTiming(ttft=predicted + miss, e2e=1.0, itl=[], tpot=None, output_tokens=1, input_tokens=None,
                               finish_reasons=[], error=None, usage_seen=True, model=None)
        assert guard.finish(ticket, timing).ttft_error == pytest.approx(abs(miss))
    assert guard.learned_headroom == pytest.approx(0.3)
    assert guard._thresholds["a"] == pytest.approx(0.7)          # 1 s less the learned 0.3 s
    high = SloClass("high", ttft=1.0, tpot=0.1, admission=True)
    assert _threshold(high, (high,), learned_headroom=5.0) == pytest.approx(0.4)    # capped at 60 % of ttft
    tolerant = SloClass("t", ttft=1.0, tpot=0.1, admission=True, admission_margin=-0.5)
    assert _threshold(tolerant, (tolerant,), learned_headroom=0.3) == pytest.approx(1.5)   # sheds only sure misses


def test_prompt_length_is_read_from_either_endpoint():
    assert prompt_chars({"prompt": "abcd" * 10}) == (40, 0)
    assert prompt_chars({"prompt": [1, 2, 3]}) == (0, 3)
    assert prompt_chars({"messages": [{"role": "user", "content": "hello"},
                                      {"role": "user", "content": [{"type": "text", "text": "abc"}]}]}) == (8, 0)


@pytest.mark.parametrize("item, message", [
    ({"admission": "yes"}, "admission must be true or false"),
    ({"admission_margin": 1}, "admission_margin must be a fraction"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"admission_hold": "no"}, "admission_hold must be true or false"),
])
def test_bad_admission_settings_name_the_key(item, message):
    from sidecar.config import ConfigError
    with pytest.raises(ConfigError, match=message):
        parse_slo_config({"classes": [{"name": "a", "ttft": 1, "tpot": 0.1, **item}]})


# ---- against the engine-like upstream -----------------------------------------------------------

OVERLOAD = (40.0, 80, 7)   # ~3x capacity, 2 s of arrivals
# Other jobs share this machine's 2 cores: a stall of a few hundred milliseconds in the upstream
# process makes every request in flight late, whatever the guard predicted. An overload check
# therefore gets up to ATTEMPTS runs and passes when one meets it; a guard that is wrong (it is
# systematic) fails every one. (Two attempts failed both once in a full `make test`: high 0.83.)
ATTEMPTS = 3


def test_admission_off_changes_nothing_even_at_overload(sidecars, engine_like):
    live = sidecars.start(engine_like, models=("scripted",),
                          slo=slo_config({"name": "interactive", "ttft": TTFT, "tpot": 1.0}))
    assert live.app.admission.enabled is False
    records = load(live.url, *OVERLOAD)
    assert [r.outcome for r in records].count("shed") == 0
    assert all(r.error is None for r in records)
    # Without the guard the queue grows and most requests miss TTFT: what the guard is for.
    assert sum(r.outcome == "good" for r in records) / len(records) < 0.6
    assert outcomes(live, "interactive")["shed"] == 0
    assert live.value("goodput_admission_predicted_ttft_seconds_count", model="scripted", slo_class="interactive") == 0


def test_low_load_sheds_nothing(sidecars, engine_like):
    live = sidecars.start(engine_like, models=("scripted",),
                          slo=slo_config({"name": "interactive", "ttft": TTFT, "tpot": 1.0, "admission": True}))
    warm(live)
    live.finished_spans(20)   # the admission histograms move in the handlers' finally, after the client read
    labels = {"model": "scripted", "slo_class": "interactive"}
    predicted = live.value("goodput_admission_predicted_ttft_seconds_count", **labels)
    checked = live.value("goodput_admission_ttft_error_seconds_count", **labels)
    records = load(live.url, 4.0, 30, seed=3)
    live.finished_spans(50)
    assert [r.outcome for r in records].count("shed") == 0
    assert outcomes(live, "interactive")["shed"] == 0
    # The guard had learned: every one of the 30 was predicted, and checked against its measured TTFT.
    assert live.value("goodput_admission_predicted_ttft_seconds_count", **labels) - predicted == 30
    assert live.value("goodput_admission_ttft_error_seconds_count", **labels) - checked == 30
    errors = live.value("goodput_admission_ttft_error_seconds_sum", **labels)
    assert errors / live.value("goodput_admission_ttft_error_seconds_count", **labels) < 0.1


def test_overload_sheds_with_429_and_the_admitted_meet_ttft(sidecars, engine_like):
    live = sidecars.start(engine_like, models=("scripted",),
                          slo=slo_config({"name": "interactive", "ttft": TTFT, "tpot": 1.0, "admission": True}))
    warm(live)
    live.finished_spans(20)   # the warm-up's last counters move in its handlers' finally, after the client read
    before = outcomes(live, "interactive")
    arrived_before = live.value("goodput_requests_arrived_total", model="scripted", slo_class="interactive")
    runs, everything = 0, []
    for attempt in range(ATTEMPTS):
        records = load(live.url, *OVERLOAD)
        runs += len(records)
        everything += records
        shed = [r for r in records if r.outcome == "shed"]
        admitted = [r for r in records if r.outcome != "shed"]
        if sum(r.outcome == "good" for r in admitted) / len(admitted) >= 0.9:
            break
    else:
        pytest.fail(f"admitted requests missed TTFT in every attempt: {[r.outcome for r in admitted]}")
    assert len(shed) >= len(records) // 3, "3x capacity: at least a third must be refused"
    assert all(r.error.startswith("HTTP 429: the server is at capacity") and r.e2e < 0.2 for r in shed)
    # The client can have read the last byte before the sidecar's finally recorded that request; the
    # span ends last there, so once every span has ended every counter has moved.
    span_outcomes = [s.attributes["goodput.outcome"] for s in live.finished_spans(20 + runs)]
    # Exactly once each: the sidecar's counters moved by what the client saw, except that the
    # sidecar times from its own receipt, not the client's scheduled send, and sees the first token
    # before the client does: it may judge good a request the client, late by its send lag or a
    # scheduling delay, judged late; never the reverse.
    after = outcomes(live, "interactive")
    moved = {o: after[o] - before[o] for o in after}
    seen = {o: sum(r.outcome == o for r in everything) for o in after}
    assert {o: moved[o] for o in ("shed", "error", "cancelled")} == {o: seen[o] for o in ("shed", "error", "cancelled")}
    assert moved["good"] + moved["slo_violated"] == seen["good"] + seen["slo_violated"]
    assert moved["good"] >= seen["good"], (moved, seen)
    assert live.value("goodput_requests_arrived_total", model="scripted", slo_class="interactive") - arrived_before == runs
    assert span_outcomes[20:].count("shed") == seen["shed"]
    shed_span = next(s for s in live.spans.get_finished_spans() if s.attributes["goodput.outcome"] == "shed")
    assert shed_span.attributes["goodput.admission.predicted_ttft_seconds"] > TTFT * 0.8


# The two-class run's objective. The upstream is FIFO, so a high arrival waits behind every low
# prompt admitted before it: what separates the classes is the room between the low class's
# threshold (PRIORITY_HEADROOM of the high one's) and the high one's. At 0.5 s that room is about
# 3 prompts of prefill, and less once the guard has learned under-shoot (up to
# MAX_LEARNED_HEADROOM of the objective), which a host that stalls teaches it. A CI run shed 3-9 of
# 24 high requests in each of three attempts at 0.5 s; it never did here, even pinned to one core
# beside a busy loop, and that log did not say why (the failure message now names the thresholds
# and the refusals). At 1 s the room is twice as many prompts; with equal priorities this test
# still fails (high 0.54-0.71).
TWO_CLASS_TTFT = 1.0


def test_high_priority_keeps_attainment_while_low_absorbs_shedding(sidecars, engine_like):
    live = sidecars.start(engine_like, models=("scripted",), slo=slo_config(
        {"name": "high", "ttft": TWO_CLASS_TTFT, "tpot": 1.0, "admission": True, "priority": 1},
        {"name": "low", "ttft": TWO_CLASS_TTFT, "tpot": 1.0, "admission": True, "priority": 0}))
    warm(live, "high")
    seen = []
    for attempt in range(ATTEMPTS):
        high, low = asyncio.run(_load(live.url, [(8.0, 24, 11, "high"), (24.0, 72, 12, "low")],  # ~2x capacity
                                      ttft=TWO_CLASS_TTFT))
        attainment = sum(r.outcome == "good" for r in high) / len(high)
        seen.append(round(attainment, 2))
        if attainment >= 0.9:
            break
    else:
        why = sorted({r.error for r in high if r.outcome == "shed"})[:3]
        pytest.fail(f"high-priority attainment < 0.9 in every attempt ({seen}); the last: {[r.outcome for r in high]}; "
                    f"thresholds {live.app.admission._thresholds}; some refusals: {why}")
    high_shed = sum(r.outcome == "shed" for r in high) / len(high)
    low_shed = sum(r.outcome == "shed" for r in low) / len(low)
    assert low_shed >= 0.3 and low_shed > 3 * high_shed


def test_openai_client_gets_rate_limit_error_and_waits_retry_after(sidecars, engine_like):
    # An objective no request can meet: once the guard has learned the engine, it sheds everything.
    live = sidecars.start(engine_like, models=("scripted",),
                          slo=slo_config({"name": "instant", "ttft": 0.001, "tpot": 1.0, "admission": True}))
    warm(live, may_shed=True)
    shed_before = outcomes(live, "instant")["shed"]
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-test", max_retries=2, timeout=20)
    start = time.monotonic()
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model="scripted", prompt="hello " * 50, max_tokens=4, stream=True)
    elapsed = time.monotonic() - start
    retry_after = int(info.value.response.headers["retry-after"])
    assert retry_after >= 1
    assert info.value.body["type"] == "rate_limit_exceeded"
    # Two retries, each after Retry-After (the client's own backoff would be under a second).
    assert elapsed >= 2 * retry_after
    assert outcomes(live, "instant")["shed"] - shed_before == 3   # the call and its two retries


# ---- a decode-bound upstream: TPOT breaks first -------------------------------------------------

STEP, STEP_PER_SEQ = 0.01, 0.002    # the upstream's token gap: 10 ms + 2 ms per stream decoding
DECODE_TOKENS = 24
TPOT = 0.05                         # threshold 0.04 s at the default margin: a batch of (0.04 - 0.01) / 0.002 = 15


@pytest.fixture(scope="module")
def decode_bound():
    # Prefill is nearly free (50,000 tokens/s), so the queue stays short and only the batch grows.
    port = free_port()
    server = ServerProcess(upstream_command(port, "--ttft", "0.005", "--itl", str(STEP), "--prefill-rate", "50000",
                                            "--itl-per-seq", str(STEP_PER_SEQ)),
                           f"http://127.0.0.1:{port}/health", timeout=30, name="decode-bound-upstream")
    yield f"http://127.0.0.1:{port}"
    server.stop()


def decode_load(url: str, rate: float, count: int, seed: int) -> list:
    async def run():
        reqs = synthetic_workload(poisson_arrivals(rate, count, seed), PROMPT_WORDS, DECODE_TOKENS, seed=seed)
        cfg = LoadConfig(base_url=url, model="scripted", slo=SloClass("load", ttft=2.0, tpot=TPOT))
        records, _ = await run_load(cfg, reqs, PromptFactory(None, seed=seed))
        return records
    return asyncio.run(run())


def test_a_decode_bound_overload_is_shed_on_tpot_and_the_admitted_meet_it(sidecars, decode_bound):
    classes = {"name": "interactive", "ttft": 2.0, "tpot": TPOT}
    off = sidecars.start(decode_bound, models=("scripted",), slo=slo_config(classes))
    on = sidecars.start(decode_bound, models=("scripted",), slo=slo_config({**classes, "admission": True}))
    # Learning at a batch of about 2, then 5 (10 req/s x 24 tokens x ~20 ms): nothing may be shed there.
    for rate, count, seed in ((5.0, 20, 21), (10.0, 30, 22)):
        assert [r.outcome for r in decode_load(on.url, rate, count, seed)].count("shed") == 0
    assert on.app.admission.estimate.decode_samples >= 16
    overload = (80.0, 120, 23)   # 1.5 s of arrivals at ~5x what a batch of 15 serves
    baseline = decode_load(off.url, *overload)
    # Without the guard the batch grows past 15 and TPOT is what most requests miss.
    assert sum(r.outcome == "good" for r in baseline) / len(baseline) < 0.5
    for attempt in range(ATTEMPTS):
        records = decode_load(on.url, *overload)
        shed = [r for r in records if r.outcome == "shed"]
        admitted = [r for r in records if r.outcome != "shed"]
        if sum(r.outcome == "good" for r in admitted) / len(admitted) >= 0.9:
            break
    else:
        pytest.fail(f"admitted requests missed TPOT in every attempt: {[r.outcome for r in admitted]}")
    assert len(shed) >= len(records) // 3
    labels = {"model": "scripted", "slo_class": "interactive"}
    # Every refusal was the batch, none the queue: this upstream prefills in a few milliseconds.
    assert on.value("goodput_admission_shed_total", reason="tpot", **labels) >= len(shed)
    assert on.value("goodput_admission_shed_total", reason="ttft", **labels) == 0
    assert on.value("goodput_admission_tpot_error_seconds_count", **labels) > 0
    span = next(s for s in on.spans.get_finished_spans() if s.attributes["goodput.outcome"] == "shed")
    assert span.attributes["goodput.admission.shed_reason"] == "tpot"
    assert span.attributes["goodput.admission.predicted_tpot_seconds"] > 0


def decode_mix_load(url: str, rate: float, count: int, seed: int, mix: dict[str, float]) -> list:
    from sidecar.loadgen.workload import assign_classes

    async def run():
        reqs = assign_classes(synthetic_workload(poisson_arrivals(rate, count, seed), PROMPT_WORDS, DECODE_TOKENS,
                                                 seed=seed), mix, seed)
        cfg = LoadConfig(base_url=url, model="scripted", slo=SloClass("load", ttft=2.0, tpot=TPOT))
        records, _ = await run_load(cfg, reqs, PromptFactory(None, seed=seed))
        return records
    return asyncio.run(run())


TWO_CLASSES = [{"name": "high", "ttft": 2.0, "tpot": TPOT, "admission": True, "priority": 1},
               {"name": "low", "ttft": 2.0, "tpot": TPOT, "admission": True, "priority": 0}]


def two_class_run(on, mix: dict[str, float], seed: int) -> tuple[list, list]:
    """Learn below the knee (high never shed there), then 300 requests at 30 req/s (2x the knee),
    up to ATTEMPTS runs until high keeps >= 95 % and the admitted >= 90 %: (high, low) records.
    (At 12 req/s low may be shed while learning: at a 1:1 mix high's 6 req/s x ~1 s in flight, up
    to its 99 % Poisson quantile, reserves most of the batch.)"""
    for rate, count, warm_seed in ((5.0, 20, seed), (12.0, 60, seed + 1)):
        warm_records = decode_mix_load(on.url, rate, count, warm_seed, mix)
        assert [r.outcome for r in warm_records if r.slo_class == "high"].count("shed") == 0
    for attempt in range(ATTEMPTS):
        records = decode_mix_load(on.url, 30.0, 300, seed + 2 + attempt, mix)
        high = [r for r in records if r.slo_class == "high"]
        low = [r for r in records if r.slo_class == "low"]
        admitted = [r for r in records if r.outcome != "shed"]
        high_good = sum(r.outcome == "good" for r in high) / len(high)
        if high_good >= 0.95 and sum(r.outcome == "good" for r in admitted) / len(admitted) >= 0.9:
            return high, low
    pytest.fail(f"high class {high_good:.1%} in time, low shed {sum(r.outcome == 'shed' for r in low)} of {len(low)}")


def test_two_classes_past_a_decode_bound_knee_the_low_one_absorbs_the_shedding(sidecars, decode_bound):
    # This upstream's knee is about 15 req/s (a batch of 15 at the 0.04-s threshold decodes 24
    # tokens in about a second). At 30 req/s, a quarter high: high offers half the knee. The guard
    # must keep high in time and refuse low. (It passed before `rising_rate` too: this is the
    # priority order end to end; the step-up is `test_the_rising_rate_follows_a_step_up...`.)
    on = sidecars.start(decode_bound, models=("scripted",), slo=slo_config(*TWO_CLASSES))
    high, low = two_class_run(on, {"high": 1.0, "low": 3.0}, seed=31)
    assert sum(r.outcome == "shed" for r in low) >= 0.4 * len(low)


def test_two_classes_at_the_knee_each_the_high_one_waits_for_a_slot_instead_of_being_refused(sidecars, decode_bound):
    # High alone offers the knee (15 req/s of 30). Refused at once when the batch is full, high lost
    # Erlang's B(15, ~13) = 9-15 % of its arrivals (82-95 % in time); held for the next slot (a
    # stream ends about every 70 ms here, its TTFT threshold is 1.6 s) it keeps >= 95 %. (With
    # admission_hold false this test fails: high 84.5 % in its last attempt.)
    on = sidecars.start(decode_bound, models=("scripted",), slo=slo_config(*TWO_CLASSES))
    high, _ = two_class_run(on, {"high": 1.0, "low": 1.0}, seed=41)
    # The client has its last [DONE] a moment before the sidecar's handler has accounted it.
    deadline = time.monotonic() + 5
    while on.app.active and time.monotonic() < deadline:
        time.sleep(0.02)
    held = {c: on.value("goodput_admission_held_seconds_count", model="scripted", slo_class=c) for c in ("high", "low")}
    assert held["high"] > 0                      # high did wait for slots...
    assert max(r.ttft for r in high if r.ttft is not None) < 2.0   # ...within its TTFT
    assert on.app.admission.held == 0            # nobody is left waiting once the load is over
    for c in ("high", "low"):
        # Counted once as demand, when it arrived, whether it was held, admitted or shed.
        ended = sum(outcomes(on, c).values())
        assert on.value("goodput_requests_arrived_total", model="scripted", slo_class=c) == ended
    span = next(s for s in on.spans.get_finished_spans()
                if s.attributes.get("goodput.admission.held_seconds", 0) > 0 and s.attributes["goodput.outcome"] == "good")
    assert span.attributes["goodput.admission.held_seconds"] < 1.6


# ---- goodput sweep --compare: the on/off comparison end to end ---------------------------------

@pytest.mark.slow
def test_sweep_compares_admission_off_and_on(start_server, engine_like, tmp_path):
    import json
    import subprocess

    import yaml

    from tests.support import goodput_command

    urls = {}
    for label, admission in (("off", False), ("on", True)):
        path = tmp_path / f"{label}.yaml"
        path.write_text(yaml.safe_dump({"classes": [{"name": "interactive", "ttft": TTFT, "tpot": 1.0, "admission": admission}]}))
        port = free_port()
        start_server(goodput_command("sidecar", "run", "--upstream", engine_like, "--port", str(port), "--slo-config", str(path),
                                     "--engine-metrics-interval", "0"), f"http://127.0.0.1:{port}/healthz", timeout=60, name=label)
        urls[label] = f"http://127.0.0.1:{port}"
    out = tmp_path / "report"
    proc = subprocess.run(goodput_command("sweep", "--compare", f"off={urls['off']},on={urls['on']}", "--model", "scripted",
                                          "--rates", "5,30", "--duration", "4", "--input-tokens", str(PROMPT_WORDS),
                                          "--output-tokens", "4", "--slo-ttft", str(TTFT), "--slo-tpot", "1",
                                          "--out", str(out), "--quiet"), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "sweep.json").read_text())
    off, on = ({p["rate"]: p for p in doc["series"][label]["points"]} for label in ("off", "on"))
    assert doc["points"] == doc["series"]["off"]["points"]       # the first series stays the top level
    assert off[5.0]["shed"] == on[5.0]["shed"] == 0               # a third of capacity: nothing shed
    assert off[30.0]["shed"] == 0 and on[30.0]["shed"] > 20       # twice capacity: the guard sheds...
    assert on[30.0]["admitted_attainment"] >= 0.9                 # ...and what it admits is served in time
    assert on[30.0]["goodput"] > 2 * off[30.0]["goodput"]
    assert (out / "goodput-compare.png").stat().st_size > 1000
    assert "## Side by side" in (out / "summary.md").read_text()


def test_sweep_refuses_a_malformed_compare_list():
    import subprocess

    from tests.support import goodput_command

    proc = subprocess.run(goodput_command("sweep", "--compare", "off=127.0.0.1:1", "--rates", "1", "--model", "m"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--compare: expected NAME=VALUE pairs" in proc.stderr and "Traceback" not in proc.stderr
