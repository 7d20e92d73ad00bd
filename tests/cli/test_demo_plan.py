"""The demo's phases and report figures, on synthetic traces and records (no servers)."""

from __future__ import annotations

import math

import pytest

from goodput_cli.demo_plan import DEFAULT_PHASES, PhaseSpec, parse_phases, phase_of, plan_phases
from goodput_cli.demo_report import lead_times, phase_figures, report_markdown, rolling_attainment
from sidecar.loadgen.summary import RequestRecord
from sidecar.loadgen.workload import PlannedRequest
from tests.support import load_script


def _trace(n=500, gap=0.3):
    # Bursty on purpose: every tenth gap is ten times longer.
    t, out = 0.0, []
    for i in range(n):
        out.append(PlannedRequest(t, 100 + i % 7, 10 + i % 3))
        t += gap * (10 if i % 10 == 9 else 1)
    return out


def test_phases_get_their_rate_and_keep_the_traces_gaps():
    trace = _trace()
    planned, phases = plan_phases(trace, capacity=2.0, specs=DEFAULT_PHASES)
    assert [p.name for p in phases] == ["under", "burst", "recovery"]
    assert phases[0].start == 0 and all(a.end == b.start for a, b in zip(phases, phases[1:]))
    for spec, p in zip(DEFAULT_PHASES, phases):
        mine = [r for r in planned if r.slo_class == p.slo_class]
        assert len(mine) == round(spec.load * 2.0 * spec.seconds)
        assert all(p.start <= r.arrival < p.end for r in mine)
        assert p.rate == pytest.approx(spec.load * 2.0, rel=0.05)
    # The trace's shape survives: long gaps are ten times the short ones within a phase.
    mine = [r.arrival for r in planned if r.slo_class == "phase-under"]
    gaps = sorted(b - a for a, b in zip(mine, mine[1:]))
    assert gaps[-1] / gaps[0] == pytest.approx(10.0, rel=1e-6)
    # Consecutive slices: lengths follow the trace in order.
    assert [r.input_tokens for r in planned[:20]] == [r.input_tokens for r in trace[:20]]


def test_a_short_trace_wraps_around_and_max_rate_scales_every_phase_alike():
    trace = _trace(n=30)
    planned, phases = plan_phases(trace, capacity=100.0, specs=DEFAULT_PHASES, max_rate=10.0)
    assert max(p.rate for p in phases) == pytest.approx(10.0, rel=0.05)
    assert phases[0].rate / phases[1].rate == pytest.approx(DEFAULT_PHASES[0].load / DEFAULT_PHASES[1].load, rel=0.05)
    assert phases[1].load == pytest.approx(0.1) and len(planned) == sum(round(p.rate * (p.end - p.start)) for p in phases)


def test_phase_arguments_are_checked():
    assert parse_phases("a:1:10,b:0.5:5") == (PhaseSpec("a", 1.0, 10.0, "1x capacity"), PhaseSpec("b", 0.5, 5.0, "0.5x capacity"))
    for bad in ("a:1", "a:0:5", "a:1:-1", "a:1:5,a:2:5", "a b:1:5", "a:x:5"):
        with pytest.raises(ValueError):
            parse_phases(bad)
    with pytest.raises(ValueError):
        plan_phases(_trace(), capacity=0.0, specs=DEFAULT_PHASES)


def _rec(i, scheduled, outcome, e2e=1.0, ttft=0.5, tpot=0.05, cls=None):
    return RequestRecord(index=i, scheduled=scheduled, sent=scheduled, input_tokens=10, max_tokens=5, outcome=outcome,
                         ttft=None if outcome == "shed" else ttft, tpot=None if outcome == "shed" else tpot,
                         e2e=None if outcome == "shed" else e2e, slo_class=cls)


def test_figures_count_every_request_once_and_rates_by_finish_time():
    _, phases = plan_phases(_trace(), capacity=1.0, specs=(PhaseSpec("under", 0.5, 10, ""), PhaseSpec("burst", 2, 10, ""),
                                                           PhaseSpec("recovery", 0.5, 10, "")))
    recs = [_rec(0, 1.0, "good"), _rec(1, 5.0, "good", e2e=6.0),                  # the second finishes in burst
            _rec(2, 11.0, "slo_violated", e2e=25.0), _rec(3, 12.0, "shed"), _rec(4, 13.0, "good"),
            _rec(5, 25.0, "good", e2e=10.0)]                                      # finishes after the last phase
    figs = phase_figures(recs, phases, series=[], run_end=35.0)
    assert [f.requests for f in figs] == [2, 3, 1]
    assert [f.good for f in figs] == [2, 1, 1] and figs[1].shed == 1 and figs[1].slo_violated == 1
    assert figs[1].attainment == pytest.approx(1 / 3)
    # Finishing in the window: under has #0; burst #1 and #4 (good); recovery #2 (late) and #5.
    assert figs[0].goodput == pytest.approx(1 / 10) and figs[0].throughput == pytest.approx(1 / 10)
    assert figs[1].goodput == pytest.approx(2 / 10) and figs[1].throughput == pytest.approx(2 / 10)
    assert figs[2].throughput == pytest.approx(2 / 15) and figs[2].goodput == pytest.approx(1 / 15)
    with pytest.raises(ValueError):
        phase_of(phases, 31.0)


def test_lead_is_when_attainment_fell_minus_when_the_forecaster_asked():
    _, phases = plan_phases(_trace(), capacity=1.0, specs=(PhaseSpec("under", 0.5, 10, ""), PhaseSpec("burst", 2, 20, "")))
    recs = [_rec(i, 0.5 * i, "good", e2e=0.5) for i in range(20)]                # fine until 10 s
    recs += [_rec(100 + i, 10 + 0.5 * i, "slo_violated", e2e=4.0) for i in range(30)]   # misses finish from 14 s
    series = [{"t": float(t), "desired_replicas": 1.0 if t < 12 else 2.0} for t in range(0, 30)]
    lead = lead_times(recs, phases, series, objective=0.9, ttft=3.0, tpot=0.5, run_end=30.0)
    assert lead["forecaster_asked_at"] == 12.0
    # Attainment over the last 10 s first drops under 90 % when 3 misses (14, 14.5, 15) sit beside
    # the 10 goods still in the window: at 15 s (10/13 = 77 %); 14.5 s gives 10/12 = 83 %, 14 s 10/11 = 91 %.
    assert lead["attainment_fell_at"] == 14.5
    assert lead["forecast_lead_seconds"] == pytest.approx(2.5)
    assert lead["first_missed_request_sent_at"] == 10.0
    # Asked only after: negative.
    late = [{"t": float(t), "desired_replicas": 1.0 if t < 20 else 2.0} for t in range(0, 30)]
    assert lead_times(recs, phases, late, 0.9, 3.0, 0.5, 30.0)["forecast_lead_seconds"] == pytest.approx(-5.5)
    # Never fell: no lead, and says so.
    ok = [_rec(i, 0.5 * i, "good", e2e=0.5) for i in range(60)]
    r = lead_times(ok, phases, series, 0.9, 3.0, 0.5, 30.0)
    assert r["forecast_lead_seconds"] is None and "never fell" in r["note"]


def test_rolling_attainment_and_markdown():
    recs = [_rec(0, 0.0, "good", e2e=1.0), _rec(1, 0.0, "slo_violated", e2e=2.0)]
    assert rolling_attainment(recs, [0.5, 1.5, 2.5, 13.0]) == [(0.5, None, 0), (1.5, 1.0, 1), (2.5, 0.5, 2),
                                                              (13.0, None, 0)]
    _, phases = plan_phases(_trace(), 1.0, (PhaseSpec("under", 0.5, 10, ""),))
    figs = phase_figures(recs, phases, [], 10.0)
    md = report_markdown({"model": "m", "trace": "t.csv", "slo": {"ttft": 3, "tpot": 0.5, "objective": 0.9},
                          "admission": False, "calibration": {"line": "measured"},
                          "phases": [f.to_json() for f in figs], "forecast_lead_seconds": None,
                          "note": "no phase above capacity"})
    assert "**under**" in md and "not measured: no phase above capacity" in md
    assert not any(isinstance(v, float) and math.isnan(v) for v in figs[0].to_json().values())


# ---- the calibration's operating point ------------------------------------------------------
def _engine_run(profile, rate, seconds, seed):
    """One replica of the simulator's fleet (vLLM V1's schedule: decode steps on the profile's
    line, prompt chunks beside them) serving `seconds` of Poisson arrivals at `rate`, as the
    load generator's records."""
    import numpy as np

    from forecaster.simulate.fleet import RequestFleet
    from forecaster.simulate.traces import RequestTrace

    rng = np.random.default_rng(seed)
    n = max(4, round(rate * seconds))
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    prompt = rng.integers(30, 120, n).astype(float)
    output = rng.integers(20, 33, n).astype(float)
    fleet = RequestFleet(profile, RequestTrace("t", arrival, prompt, output), initial_replicas=1, cold_start_s=0.0,
                         tick_s=0.01)
    now = 0.0
    while now < arrival[-1] or not fleet.idle:
        fleet.step(now)
        now += 0.01
    first, done = fleet.t_first, fleet.t_done
    return [RequestRecord(index=i, scheduled=float(arrival[i]), sent=float(arrival[i]), input_tokens=int(prompt[i]),
                          max_tokens=int(output[i]), outcome="good", ttft=float(first[i] - arrival[i]),
                          tpot=float((done[i] - first[i]) / (output[i] - 1)), e2e=float(done[i] - arrival[i]),
                          output_tokens=int(output[i]))
            for i in range(n)]


def test_the_operating_points_slope_is_the_engines_whatever_the_arrivals_clumped():
    """Short runs at one rate leave different batches (Poisson clumps): the slope fitted against
    the batch each request decoded in is the engine's own in every one, and the TPOT they show is
    not."""
    from dataclasses import replace

    import numpy as np

    from forecaster.service_model import Slo, TokenMix
    from forecaster.simulate.profiles import ServiceProfile
    from goodput_cli.demo_plan import fit_to_operating_point

    engine = ServiceProfile(name="e", prefill_tokens_per_s=800.0, decode_base_s=0.042, decode_per_seq_s=0.004,
                            kv_capacity_tokens=1e6, max_batch=64, step_token_budget=512, slo=Slo(3.0, 0.5))
    # The probes' line, as the calibration starts from it: the right base, a slope off by 2x.
    probes = replace(engine, decode_per_seq_s=0.002)
    mix = TokenMix.from_samples(list(range(30, 120)), [20 + i % 13 for i in range(90)])
    slo = [Slo(3.0, 0.5, 0.9, "demo")]
    truth = engine.slo_capacity_rps(mix, slo)
    slopes, capacities, tpots = [], [], []
    for seed in range(6):
        records = _engine_run(engine, 4.0, 12.0, seed)
        tpots.append(np.mean([r.tpot for r in records]))
        fitted = fit_to_operating_point(probes, mix, 4.0, records)
        slopes.append(fitted.decode_per_seq_s)
        capacities.append(fitted.slo_capacity_rps(mix, slo))
    assert max(tpots) / min(tpots) > 1.5, tpots       # the runs did differ (102-204 ms)
    for slope, capacity in zip(slopes, capacities):
        assert slope == pytest.approx(0.004, rel=0.12), slopes
        assert capacity == pytest.approx(truth, rel=0.05), (capacities, truth)


def test_an_operating_point_with_too_few_decodes_leaves_the_model_alone():
    from forecaster.service_model import TokenMix
    from forecaster.simulate.profiles import CPU_SMOLLM2
    from goodput_cli.demo_plan import fit_to_operating_point

    one = RequestRecord(index=0, scheduled=0.0, sent=0.0, input_tokens=50, max_tokens=1, ttft=0.2, e2e=0.2,
                        output_tokens=1)
    mix = TokenMix.from_samples([50], [1])
    assert fit_to_operating_point(CPU_SMOLLM2, mix, 1.0, [one, one]) is CPU_SMOLLM2


def test_an_operating_point_where_every_request_decoded_alone_leaves_a_one_sequence_step_alone():
    """With a one-sequence step of its own the model's slope shows only beside another sequence."""
    from dataclasses import replace

    from forecaster.service_model import TokenMix
    from forecaster.simulate.profiles import CPU_SMOLLM2
    from goodput_cli.demo_plan import fit_to_operating_point

    model = replace(CPU_SMOLLM2, decode_single_s=0.07)
    alone = [RequestRecord(index=i, scheduled=10.0 * i, sent=10.0 * i, input_tokens=50, max_tokens=10, ttft=0.2,
                           tpot=0.07, e2e=0.83, output_tokens=10) for i in range(4)]
    assert fit_to_operating_point(model, TokenMix.from_samples([50], [10]), 0.1, alone) is model


def test_small_batches_leave_the_probes_slope_alone():
    """A live step that costs more than the probes' by a constant (the client and the sidecar share
    the cores) shows at small batches as a steep slope: fitted through batches of about 2 it cut the
    capacity to half (AMD EPYC host: 1.0-1.2 req/s calibrated, 4.5 met), when the slope alone was
    fitted. Under `min_batch` the probes' curve stays; above it the run's slope and concave part
    are fitted (the test above)."""
    from dataclasses import replace

    from forecaster.service_model import Slo, TokenMix
    from forecaster.simulate.profiles import ServiceProfile
    from goodput_cli.demo_plan import DECODE_BATCHES, fit_to_operating_point

    engine = ServiceProfile(name="e", prefill_tokens_per_s=800.0, decode_base_s=0.060, decode_per_seq_s=0.001,
                            decode_log_s=0.030, kv_capacity_tokens=1e6, max_batch=64, step_token_budget=512,
                            slo=Slo(3.0, 0.5))
    probes = replace(engine, decode_base_s=0.040)       # the curve's shape right, 20 ms a step under
    mix = TokenMix.from_samples(list(range(30, 120)), [20 + i % 13 for i in range(90)])
    slo = [Slo(3.0, 0.5, 0.9, "demo")]
    truth = engine.slo_capacity_rps(mix, slo)
    for seed in range(3):
        records = _engine_run(engine, 1.0, 12.0, seed)
        kept = fit_to_operating_point(probes, mix, 1.0, records, min_batch=DECODE_BATCHES[0])
        assert kept.decode_per_seq_s == probes.decode_per_seq_s
        assert kept.slo_capacity_rps(mix, slo) == pytest.approx(truth, rel=0.1)
        # Fitted there as the calibration fits (the slope alone beside both terms, the one that
        # serves less kept), the steep start halves the capacity.
        through_small = fit_to_operating_point(probes, mix, 1.0, records, slo=slo)
        assert through_small.slo_capacity_rps(mix, slo) < 0.6 * truth


@pytest.mark.parametrize("probe8_error", [1.0, 1.1])
def test_a_noisy_eight_stream_probe_does_not_move_the_capacity(probe8_error):
    """The probes' 8-stream step varies by about 10 % between runs, and it sets the concave part
    of the curve through 1, 8 and 32; their 32-stream step reads under the live one (SmolLM2 on
    the AMD EPYC host: 208-232 ms against about 245 for live requests at 32). The operating
    point's requests (20 s at 0.85 of the capacity, as the calibration runs it) refit the slope and
    the concave part together, so the capacity, decided at larger batches than they decoded in,
    comes out the engine's whatever the probes read: 0.93-1.02x here. With the slope alone refitted
    under the probes' concave part it read 1.12-1.14x and 1.34-1.39x."""

    from forecaster.service_model import Slo, TokenMix
    from forecaster.service_prior import model_from_bench
    from forecaster.simulate.profiles import ServiceProfile
    from goodput_cli.demo_plan import DECODE_BATCHES, fit_to_operating_point

    engine = ServiceProfile(name="e", prefill_tokens_per_s=630.0, decode_base_s=0.036, decode_per_seq_s=0.0045,
                            decode_log_s=0.015, kv_capacity_tokens=1e6, max_batch=64, step_token_budget=512,
                            slo=Slo(3.0, 0.5))
    error = {1: 1.0, 8: probe8_error, 32: 0.88}
    steps = {b: engine.step_s(b) * error[b] for b in (1, *DECODE_BATCHES)}
    probes = model_from_bench({"engine_decode": [{"batch": b, "step_s": s} for b, s in steps.items()],
                               "engine_prefill": {"tokens_per_s": 630.0}}, step_token_budget=512, max_batch=64)
    mix = TokenMix.from_samples(list(range(30, 120)), [20 + i % 13 for i in range(90)])
    slo = [Slo(3.0, 0.5, 0.9, "demo")]
    truth = engine.slo_capacity_rps(mix, slo)
    off = abs(probes.slo_capacity_rps(mix, slo) / truth - 1.0)
    assert off > 0.08, (probes.slo_capacity_rps(mix, slo), truth)       # the probes alone are off
    for seed in range(3):
        rate = 0.85 * truth
        records = _engine_run(engine, rate, 20.0, seed)
        fitted = fit_to_operating_point(probes, mix, rate, records, min_batch=DECODE_BATCHES[0], slo=slo)
        assert fitted.slo_capacity_rps(mix, slo) == pytest.approx(truth, rel=0.08), (seed, truth)


def test_a_demo_calibration_refits_from_its_records_to_the_capacity_it_printed():
    """A `make demo` run of 2026-12-07 (AMD EPYC; docs/demo/runs.md (d)): its calibration-records.jsonl (the
    inter-token gaps dropped), read back and refitted by scripts/calibration_spread.py through the
    calibration's own functions, gives the 2.66 req/s the calibration printed. That run's second
    operating point decoded in batches of 6-17: the slope and concave part together read 3.53
    req/s there, the slope alone 2.66, and the calibration planned on the one that serves less."""
    import json
    from pathlib import Path

    from forecaster.service_model import Slo, TokenMix
    from goodput_cli.demo_plan import read_calibration_records

    spread = load_script("calibration_spread.py")
    data = Path(__file__).parent / "data"
    stages = read_calibration_records(data / "demo-smollm2-epyc-2026-12-07d.calibration-records.jsonl.gz")
    assert [s for s, _ in stages][:3] == ["warm-up", "prefill-short", "prefill-long"]
    assert [len(r) for s, r in stages if s.startswith("decode-")] == [1, 8, 32]
    bench = json.loads((data / "demo-smollm2-epyc-2026-12-07d.calibration.json").read_text())
    mix = TokenMix.from_samples(*spread.demo_mix())
    fit = spread.refit_one(stages, bench["probes"]["operating_point"]["rate"], mix, [Slo(3.0, 0.5, 0.9, "demo")])
    assert fit["serves less (planned)"] == pytest.approx(2.66, abs=0.005)
    assert fit["slope alone"] == pytest.approx(2.66, abs=0.005)
    assert fit["slope and concave part"] == pytest.approx(3.53, abs=0.005)
    # The prior the forecaster was handed is that fit's step at the probes' batches.
    assert [round(d["step_s"] * 1000, 1) for d in bench["engine_decode"]] == [
        round(v * 1000, 1) for v in fit["steps"]]
