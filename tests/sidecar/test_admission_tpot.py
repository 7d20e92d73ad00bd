"""The goodput guard's TPOT term (sidecar/admission.py), exactly: timers and samples fed by hand.

No upstream and no clock: every timestamp is a number given to `arrive`, every first token is set
on a stand-in timer, every finished request is a `RequestTiming` built here. So each decision and
each predicted TPOT can be checked against the arithmetic it should follow.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from dataclasses import dataclass

import pytest

from sidecar.admission import Admission
from sidecar.admission_estimate import RateWindow, ServiceEstimate
from sidecar.config import parse_slo_config
from sidecar.timing import RequestTiming

PROMPT = {"prompt": "x" * 400}    # 400 characters: 100 prompt tokens at the first guess of 4 a token


@dataclass
class Timer:
    """What the guard reads of a StreamTimer: when the request started, when its first token came."""

    start: float
    first_token_at: float | None = None


def guard(*classes: dict, step=(0.02, 0.01), seconds_per_token=0.0) -> Admission:
    """A guard whose estimate already knows a replica with step(B) = step[0] + step[1] x B and
    `seconds_per_token` of prefill per prompt token (20 samples each: past MIN_SAMPLES)."""
    config = parse_slo_config({"classes": list(classes), "rules": [{"header": "x-slo-class"}]})
    g = Admission(config)
    teach(g.estimate, step, seconds_per_token)
    return g


def teach(est: ServiceEstimate, step, seconds_per_token) -> None:
    # Prefill first, with nothing decoding and no step line yet: TTFT = tokens x cost exactly.
    for i in range(20):
        ahead = 100 + 50 * i
        est.observe_ttft(ahead * seconds_per_token, ahead, 0.0, 0)
    # Then finished streams at batches 1..10, each slowed by 5 prompt tokens prefilled per token gap.
    for i in range(20):
        batch = 1 + i % 10
        est.observe_decode(step[0] + step[1] * batch + 5 * seconds_per_token, batch, 5.0)


def cls(name="a", ttft=10.0, tpot=0.2, priority=0, **extra) -> dict:
    return {"name": name, "ttft": ttft, "tpot": tpot, "admission": True, "admission_margin": 0.2, "priority": priority,
            **extra}


def timing(ttft: float, e2e: float, output_tokens: int, error: str | None = None) -> RequestTiming:
    tpot = (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 and error is None else None
    return RequestTiming(ttft=ttft, e2e=e2e, itl=[], tpot=tpot, output_tokens=output_tokens, input_tokens=None,
                         finish_reasons=[], error=error, usage_seen=True, model=None)


# ---- the estimate --------------------------------------------------------------------------------

def test_the_step_line_is_learned_bare_of_the_prefills_that_ran_during_the_decode():
    est = ServiceEstimate()
    teach(est, (0.05, 0.01), 0.001)
    assert est.prefill_rate == pytest.approx(1000)                # 1 ms a prompt token
    # Each sample measured step(B) + 5 tokens x 1 ms; the line is the step alone.
    assert est.step_time(0) == pytest.approx(0.05)
    assert est.step_time(10) == pytest.approx(0.15)
    # 400 prompt tokens/s at 1 ms each: the engine prefills 40 % of the time.
    assert est.prefill_share(400) == pytest.approx(0.4)
    assert est.prefill_share(5000) == pytest.approx(0.9)         # capped: saturation is the TTFT guard's to refuse
    # TPOT = step(B) / (1 - rho): over a decode of D seconds, rho x D of it was prefill.
    assert est.predict_tpot(10, 0.5) == pytest.approx(0.15 / 0.5)
    # The largest batch with step(B) / (1 - 0.5) <= 0.3: 0.05 + 0.01 B <= 0.15, B = 10 (not 9 by rounding).
    assert est.max_batch(0.3, 0.5) == 10
    assert est.max_batch(0.09, 0.5) == 0                          # not even the intercept fits


def test_a_flat_step_line_limits_no_batch_unless_its_intercept_misses():
    est = ServiceEstimate()
    for _ in range(20):
        est.observe_decode(0.1, 4.0)                              # one batch only: no slope to learn
    assert est.max_batch(0.2, 0.0) == math.inf
    assert est.max_batch(0.2, 0.6) == 0                           # 0.1 / 0.4 = 0.25 > 0.2


def test_rate_window_counts_the_last_seconds_and_never_divides_by_less_than_one():
    r = RateWindow(10.0)
    assert r.rate(0.0) == 0.0
    r.add(0.0, 100)
    r.add(0.001, 100)
    assert r.rate(0.002) == pytest.approx(200)                    # two a millisecond apart: 200 in "one second"
    for t in range(1, 21):
        r.add(float(t), 100)
    # At t = 20 the window holds t = 10..20: 11 events of 100 over 10 s.
    assert r.rate(20.0) == pytest.approx(110)


def test_the_rising_rate_follows_a_step_up_within_a_few_arrivals_and_a_step_down_with_the_window():
    r = RateWindow(10.0)
    for t in range(10):
        r.add(float(t))                                           # one a second
    # Steady: the last 8 (t = 2..9, 7 gaps over 7.5 s) say 0.93/s, the window 10 over 9.5 s.
    assert r.rising_rate(9.5) == pytest.approx(10 / 9.5)
    for k in range(1, 9):
        r.add(10.0 + 0.1 * k)                                     # then ten a second
    # The window still averages the quiet spell (17 events over 10 s); the last 8 show the step.
    assert r.rate(10.8) == pytest.approx(1.7)
    assert r.rising_rate(10.8) == pytest.approx(7 / 0.7)
    # Arrivals stop: the quick rate decays as time passes since the 8th last, never under the window's.
    assert r.rising_rate(15.0) == pytest.approx(7 / 4.9)
    assert r.rising_rate(20.0) == pytest.approx(0.8)              # the window's 8 over 10 s


# ---- decisions -----------------------------------------------------------------------------------

def test_nothing_is_shed_on_tpot_before_enough_streams_finished():
    g = Admission(parse_slo_config({"classes": [cls()]}))
    tickets = [g.arrive(g._classes[0], PROMPT, True, Timer(float(t)), float(t)) for t in range(40)]
    assert all(t.admitted for t in tickets)
    assert {t.predicted_tpot for t in tickets} == {None}          # not even predicted: nothing learned yet


def test_the_batch_a_request_would_join_is_shed_once_its_tpot_would_miss():
    # step(B) = 20 ms + 10 ms x B, 1 ms a prompt token; objective 0.2 s, margin 20 %: shed above 0.16 s.
    g = guard(cls(), seconds_per_token=0.001)
    slo = g._classes[0]
    tickets = []
    for k in range(13):
        # One 100-token request a second: from the second on, 100 prompt tokens/s admitted, rho = 0.1.
        tickets.append(g.arrive(slo, PROMPT, True, Timer(float(k)), float(k)))
    admitted, last = tickets[:12], tickets[12]
    assert all(t.admitted for t in admitted)
    assert [t.join_batch for t in admitted] == list(range(1, 13))
    assert admitted[0].predicted_tpot == pytest.approx(0.03)      # alone, nothing arriving yet: step(1)
    assert admitted[11].predicted_tpot == pytest.approx(0.14 / 0.9)   # step(12) / (1 - 0.1) = 0.156 <= 0.16
    # The 13th would decode beside 12: step(13) / 0.9 = 0.167 > 0.16.
    assert last.shed and last.reason == "tpot"
    assert last.predicted_tpot == pytest.approx(0.15 / 0.9)
    assert last.batch_limit == 12
    assert "predicted time per output token (0.167 s, decoding beside 12 others, prefills taking 10 % of the engine)" in last.detail
    assert last.retry_after == 1                                   # nothing has finished yet: a second


def test_a_finished_request_frees_its_place_in_the_batch():
    g = guard(cls())
    slo = g._classes[0]
    # Without prefill cost rho = 0: the batch may reach (0.16 - 0.02) / 0.01 = 14.
    # Each first token at once (TTFT 0, as the estimate's 0 s a prompt token predicts): decoding at the next arrival.
    tickets = [g.arrive(slo, PROMPT, True, Timer(0.1 * k, 0.1 * k), 0.1 * k) for k in range(14)]
    assert all(t.admitted for t in tickets)
    assert g.arrive(slo, PROMPT, True, Timer(1.5), 1.5).reason == "tpot"
    g.finish(tickets[0], timing(0.0, 2.0, 1))   # one token: no TPOT, so the step line is left as taught
    again = g.arrive(slo, PROMPT, True, Timer(2.1), 2.1)
    assert again.admitted and again.join_batch == 14


def test_ttft_is_checked_first_and_names_its_reason():
    # A 1 s TTFT objective: shed above 0.8 s; with 1 ms a prompt token that is 8 requests of 100 tokens.
    g = guard(cls(ttft=1.0, tpot=10.0), seconds_per_token=0.001)
    slo = g._classes[0]
    tickets = [g.arrive(slo, PROMPT, True, Timer(float(k)), float(k)) for k in range(9)]
    assert [t.reason for t in tickets] == [None] * 7 + ["ttft", "ttft"]
    # 700 tokens waiting + its own 100 at 1 ms, plus step(0) = 0.02 s.
    assert tickets[7].predicted_ttft == pytest.approx(0.82)
    assert "predicted time to first token (0.82 s)" in tickets[7].detail


def test_lower_priority_leaves_the_higher_class_room_from_its_arrival_rate():
    g = guard(cls("high", priority=1), cls("low", priority=0))
    high, low = g._classes
    g.in_flight_seconds = 10.0
    highs = [g.arrive(high, PROMPT, True, Timer(t, t + 0.01), t) for t in (0.0, 5.0)]
    assert all(t.admitted for t in highs)
    # At t = 10 high arrives at 2 per 10 s: 0.2/s x 10 s in flight = 2 expected, plus z = 2.33
    # standard deviations (its 99 % objective's quantile of a Poisson count): 5.29 reserved, more than
    # the 2 it has in flight. Of the 14 the step allows, low gets 8.
    # (All at t = 10, so that the rate stays the same for each of them.)
    z = NormalDist().inv_cdf(0.99)
    lows = [g.arrive(low, PROMPT, True, Timer(10.0), 10.0) for _ in range(9)]
    assert [t.admitted for t in lows] == [True] * 8 + [False]
    # The 9th is held for a slot, not refused: a stream ends every 10 s / 10 in flight = 1 s, and its
    # TTFT threshold (half of high's 8 s: 4 s) less the predicted 0.04 s leaves room to wait for one.
    assert lows[8].held and lows[8].reason is None and lows[8].deadline == pytest.approx(10.0 + 4.0 - 0.04)
    assert lows[8].batch_limit == pytest.approx(14 - 2 - z * math.sqrt(2))
    assert lows[8].predicted_tpot == pytest.approx(0.02 + 0.01 * 11)   # its own TPOT would have been fine
    # High still finds its room, up to the batch the step allows; past it, high is held too, ahead of low.
    more = [g.arrive(high, PROMPT, True, Timer(11.0 + k), 11.0 + k) for k in range(5)]
    assert [t.admitted for t in more] == [True, True, True, True, False]
    assert more[4].held and more[4].join_batch == 15
    assert g.held == 2
    # Nothing finished by low's deadline: it is refused then, with why, and high waits on to its own.
    assert g.review(lows[8].deadline) == [lows[8]]
    assert lows[8].reason == "tpot" and not lows[8].held
    # By then high fills the batch to 14: the refusal names what holds at its deadline.
    assert "predicted time per output token (0.170 s, decoding beside 14 others" in lows[8].detail
    assert "held 3.96 s for a decode slot, none came in time" in lows[8].detail
    assert more[4].held and g.held == 1


def test_the_tightest_tpot_in_flight_limits_a_looser_class():
    # "batch" tolerates 1 s a token, but admitting it slows the "chat" requests decoding at 0.1 s.
    g = guard(cls("chat", tpot=0.1, priority=1), cls("batch", tpot=1.0, priority=1))
    chat, batch = g._classes
    for k in range(3):
        assert g.arrive(chat, PROMPT, True, Timer(0.0, 0.01), 0.01 * k).admitted
    # chat's 0.08 s threshold allows step(B) = 0.02 + 0.01 B <= 0.08: B = 6. batch's own would allow 78.
    admitted = [g.arrive(batch, PROMPT, True, Timer(1.0), 1.0 + 0.01 * k).admitted for k in range(4)]
    assert admitted == [True, True, True, False]


def test_admission_off_classes_are_counted_in_the_batch_but_never_shed():
    g = guard(cls("guarded"), {"name": "free", "ttft": 10.0, "tpot": 0.2})
    guarded, free = g._classes
    tickets = [g.arrive(free, PROMPT, True, Timer(0.0), 0.01 * k) for k in range(20)]
    assert all(t.admitted for t in tickets) and tickets[-1].predicted_tpot == pytest.approx(0.22)
    assert g.arrive(guarded, PROMPT, True, Timer(1.0), 1.0).reason == "tpot"


# ---- learning from finished requests -------------------------------------------------------------

def test_a_finished_stream_teaches_its_mean_batch_and_the_prefills_during_its_decode():
    g = guard(cls(), seconds_per_token=0.001)
    slo = g._classes[0]
    seen = []
    g.estimate.observe_decode = lambda tpot, batch, prefilled: seen.append((tpot, batch, prefilled))
    a = g.arrive(slo, PROMPT, True, Timer(0.0, 1.0), 0.0)
    b = g.arrive(slo, PROMPT, True, Timer(4.0, 6.0), 4.0)          # decodes from 6 s: half of a's decode
    checked = g.finish(a, timing(1.0, 11.0, 11))                   # first token at 1 s, last at 11 s: 1 s a token
    # a decoded 10 s, b beside it for the last 5: mean batch 1.5. b's 100 prompt tokens were prefilled
    # during a's decode (its first token came at 6 s): 100 tokens over 10 gaps.
    assert seen == [(pytest.approx(1.0), pytest.approx(1.5), pytest.approx(10.0))]
    assert checked.tpot_error == pytest.approx(abs(a.predicted_tpot - 1.0))
    assert checked.ttft_error == pytest.approx(abs(a.predicted_ttft - 1.0))
    # b, finishing later, sees a's span from the remembered decodes: a beside it from 6 s to 11 s of its 6..16.
    g.finish(b, timing(2.0, 12.0, 11))
    assert seen[1] == (pytest.approx(1.0), pytest.approx(1.5), pytest.approx(0.0))
    assert g.in_flight_seconds == pytest.approx(0.9 * 11.0 + 0.1 * 12.0)


def test_a_failed_request_teaches_nothing_and_reports_no_error():
    g = guard(cls())
    ticket = g.arrive(g._classes[0], PROMPT, True, Timer(0.0, 0.5), 0.0)
    before = g.estimate.decode_samples
    checked = g.finish(ticket, timing(0.5, 3.0, 10, error="http_500"))
    assert (checked.ttft_error, checked.tpot_error) == (None, None)
    assert g.estimate.decode_samples == before and g.in_flight_seconds is None


def test_at_debug_level_every_refusal_and_finished_stream_is_logged(caplog):
    g = guard(cls(), seconds_per_token=0.001)
    slo = g._classes[0]
    with caplog.at_level("DEBUG", logger="goodput.sidecar.admission"):
        tickets = [g.arrive(slo, PROMPT, True, Timer(float(k), first_token_at=k + 0.5), float(k)) for k in range(13)]
        g.finish(tickets[0], timing(0.5, 3.5, 31))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("shed class=a reason=tpot join=13 predicted_tpot=0.167 tpot_threshold=0.160 batch_limit=12.000")
    assert lines[1].startswith("done class=a join=1 predicted_tpot=0.030 measured_tpot=0.100 ")


# ---- holding a request for a decode slot ---------------------------------------------------------

def test_a_request_with_ttft_to_spare_waits_for_a_slot_and_the_higher_class_gets_it_first():
    # Batch limit 14 (step 20 ms + 10 ms x B under 0.16 s); 14 s in flight: a stream ends about
    # every second. TTFT 10 s: threshold 8 s for high, 4 s (half of high's) for low.
    g = guard(cls("high", priority=1), cls("low", priority=0))
    high, low = g._classes
    g.in_flight_seconds = 14.0
    first = [g.arrive(high, PROMPT, True, Timer(0.0, 0.0), 0.0) for _ in range(14)]
    assert all(t.admitted for t in first)
    waiting_low = g.arrive(low, PROMPT, True, Timer(1.0), 1.0)
    waiting_high = g.arrive(high, PROMPT, True, Timer(2.0), 2.0)
    assert waiting_low.held and waiting_high.held
    assert g.review(2.5) == []                       # nothing finished: both still held
    # One stream ends: the slot goes to high, although low has waited longer.
    g.finish(first[0], timing(0.0, 3.0, 1))
    assert g.review(3.0) == [waiting_high]
    assert waiting_high.admitted and waiting_high.held_seconds == pytest.approx(1.0)
    assert waiting_high.predicted_ttft == pytest.approx(1.0 + 0.15)   # held 1 s + step(13)
    assert waiting_low.held
    # The next slot is not low's either: high's 16 arrivals in 2 s reserve the batch (Little's law).
    g.finish(first[1], timing(0.0, 3.5, 1))
    assert g.review(3.5) == [] and waiting_low.held
    assert g.review(waiting_low.deadline) == [waiting_low] and waiting_low.reason == "tpot"
    assert g.held == 0


def test_a_request_is_refused_at_once_when_the_wait_for_a_slot_would_outlast_its_ttft():
    g = guard(cls(ttft=1.0))                         # threshold 0.8 s
    slo = g._classes[0]
    g.in_flight_seconds = 28.0                       # 14 in flight: a stream ends every 2 s
    tickets = [g.arrive(slo, PROMPT, True, Timer(0.0, 0.0), 0.0) for _ in range(15)]
    assert [t.admitted for t in tickets] == [True] * 14 + [False]
    assert tickets[14].reason == "tpot" and not tickets[14].held and g.held == 0


def full_batch() -> tuple[Admission, object, list]:
    """One class, its batch limit of 14 reached at t = 0; 14 s in flight: a stream ends about
    every second."""
    g = guard(cls())
    slo = g._classes[0]
    g.in_flight_seconds = 14.0
    return g, slo, [g.arrive(slo, PROMPT, True, Timer(0.0, 0.0), 0.0) for _ in range(14)]


def test_held_requests_of_one_class_go_in_arrival_order_and_a_late_one_queues_behind():
    g, slo, full = full_batch()
    a = g.arrive(slo, PROMPT, True, Timer(1.0), 1.0)
    b = g.arrive(slo, PROMPT, True, Timer(1.5), 1.5)
    assert a.held and b.held
    g.finish(full[0], timing(0.0, 2.0, 1))
    assert g.review(2.0) == [a]                      # one slot: the one held longest
    assert b.held
    g.withdraw(b, 2.2)                               # its client went away
    assert b.was_held and b.held_seconds == pytest.approx(0.7)
    assert g.held == 0 and g.review(2.5) == []


def test_learning_leaves_out_the_time_a_request_was_held():
    g, slo, full = full_batch()
    held = g.arrive(slo, PROMPT, True, Timer(1.0), 1.0)
    g.finish(full[0], timing(0.0, 3.0, 1))
    assert g.review(3.0) == [held] and held.held_seconds == pytest.approx(2.0)
    before = g.in_flight_seconds
    # Measured from its arrival: TTFT 2.0 s (2 s held, nothing at the engine), 6 s in all.
    g.finish(held, timing(2.0, 6.0, 1))
    assert g.in_flight_seconds == pytest.approx(0.9 * before + 0.1 * 4.0)   # 4 s at the engine, not 6
