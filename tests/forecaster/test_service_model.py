"""The service model: its predictions against the simulated fleet (the same physics request by
request), learning it online from fleet samples, and planning replicas on it."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import pytest

from forecaster.policy import ForecastPolicy, PolicyConfig
from forecaster.fleet_sample import StepObservation
from forecaster.service_learn import OnlineServiceModel
from forecaster.service_model import ServiceModel, Slo, TokenMix
from forecaster.simulate.fleet import RequestFleet
from forecaster.simulate.profiles import H100_70B, ServiceProfile
from forecaster.simulate.traces import RequestTrace, read_azure_csv
from tests.support import TRACES, load_script


def _poisson_trace(rate, seconds, prompts, outputs, seed=1, start=0.0):
    rng = np.random.default_rng(seed)
    arrivals = start + np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds)))
    pick = rng.integers(0, len(prompts), len(arrivals))
    return arrivals, np.asarray(prompts, float)[pick], np.asarray(outputs, float)[pick]


def _serve(profile, arrivals, prompts, outputs, replicas=1, tick=0.05, policy=None, sample_every=5.0):
    """One fixed-size fleet serving the requests; optionally a ForecastPolicy observing it."""
    trace = RequestTrace("t", arrivals, prompts, outputs)
    fleet = RequestFleet(profile, trace, replicas, 0.0, tick)
    slos = (Slo(ttft_s=profile.slo.ttft_s, tpot_s=profile.slo.tpot_s, ratio=0.99),)
    decisions = []
    t, k, next_sample = 0.0, 0, sample_every
    while (not fleet.idle or t < arrivals[-1]) and t < arrivals[-1] + 600:
        fleet.step(t)
        k += 1
        t = k * tick
        if policy is not None and t + 1e-9 >= next_sample:
            t = round(t, 6)   # on the step grid, as the forecaster's own loop keeps it
            next_sample += sample_every
            v = fleet.view(t)
            policy.observe(v.sample(slos))
            decisions.append((t, policy.decide(t), v))
    return fleet, decisions


@pytest.fixture(scope="module")
def azure_mix():
    path = TRACES / "azure2023_code.csv"
    if not path.is_file():
        pytest.skip("needs ../shared/traces")
    trace = read_azure_csv(path)
    return trace.prompt_tokens.astype(float), np.maximum(1.0, trace.output_tokens.astype(float))


def test_predictions_match_the_simulated_replica_on_the_azure_mix(azure_mix):
    prompts, outputs = azure_mix
    mix = TokenMix.from_samples(prompts, outputs)
    capacity = H100_70B.slo_capacity_rps(mix, [H100_70B.slo])
    # A 70B replica on 4 H100s serves a few Azure code requests a second (2k-token prompts).
    assert 2.0 < capacity < 8.0
    errors = []
    for share in (0.5, 0.75, 1.0):
        rate = capacity * share
        arrivals, p, o = _poisson_trace(rate, 1500, prompts, outputs)
        fleet, _ = _serve(H100_70B, arrivals, p, o)
        done = np.isfinite(fleet.t_done) & (fleet.arrival > 150)
        ttft = (fleet.t_first - fleet.arrival)[done]
        multi = done & (fleet.output > 1)
        tpot = ((fleet.t_done - fleet.t_first) / np.maximum(fleet.output - 1, 1))[multi]
        pred = H100_70B.predict(rate, mix)
        for measured, predicted in ((np.quantile(ttft, 0.5), pred.ttft_quantile(0.5)),
                                    (np.quantile(ttft, 0.99), pred.ttft_quantile(0.99)),
                                    (np.quantile(tpot, 0.5), pred.tpot_quantile(0.5)),
                                    (np.quantile(tpot, 0.99), pred.tpot_quantile(0.99))):
            errors.append(abs(predicted - measured) / measured)
    # Measured when written: worst 32 % (TPOT p99 at half load), median 9 %.
    assert max(errors) < 0.4, errors
    assert float(np.median(errors)) < 0.15, errors


def test_past_saturation_the_prediction_is_unstable_and_capacity_falls_with_longer_prompts(azure_mix):
    prompts, outputs = azure_mix
    mix = TokenMix.from_samples(prompts, outputs)
    assert not H100_70B.predict(100.0, mix).stable
    assert math.isinf(H100_70B.predict(100.0, mix).ttft_quantile(0.5))
    base = H100_70B.slo_capacity_rps(mix, [H100_70B.slo])
    longer = H100_70B.slo_capacity_rps(mix.scaled(prompt=4.0), [H100_70B.slo])
    # Prefill dominates this mix, so four times the prompt tokens leaves at most a quarter; less,
    # since the longest prompts (4 x 7k tokens) then take most of the 2 s TTFT objective alone.
    assert 0.0 < longer < 0.25 * base


def _learn_over_phases(profile, rates, seconds, prompts, outputs) -> ForecastPolicy:
    """A forecaster policy (5-s steps) that watched one replica serve Poisson phases at `rates`."""
    t0, chunks = 0.0, []
    for i, rate in enumerate(rates):
        a, p, o = _poisson_trace(rate, seconds, prompts, outputs, seed=i, start=t0)
        chunks.append((a, p, o))
        t0 = a[-1]
    arrivals, p, o = (np.concatenate(x) for x in zip(*chunks))
    policy = ForecastPolicy(PolicyConfig(step_seconds=5.0, horizon_seconds=30.0, cold_start_seconds=30.0,
                                         models=("level",)))
    _serve(profile, arrivals, p, o, policy=policy)
    return policy


def test_online_fit_recovers_a_known_replica():
    truth = ServiceModel(prefill_tokens_per_s=5000.0, decode_base_s=0.03, decode_per_seq_s=0.004,
                         kv_capacity_tokens=200_000, max_batch=256, step_token_budget=512)
    mix = TokenMix.from_means(400.0, 120.0)
    learner = OnlineServiceModel()
    profile = ServiceProfile(**truth.to_dict(), slo=Slo(ttft_s=5.0, tpot_s=0.5))
    prompts, outputs = mix.prompt_tokens, mix.output_tokens
    # Load moving between 20 % and 90 % of what the replica sustains, as traffic does over a day.
    cap = truth.slo_capacity_rps(mix, [Slo(ttft_s=5.0, tpot_s=0.5)])
    policy = _learn_over_phases(profile, [share * cap for share in (0.2, 0.5, 0.9, 0.35, 0.7)], 240,
                                prompts, outputs)
    learner = policy.service
    m = learner.model()
    assert m is not None
    # The engine's token budget is not exported, so the decode part of a prompt's chunk steps is
    # folded into the learned rate. And the simulated replica places a first token pro rata
    # inside its tick, while a real engine (and the model) adds the rest of the running step and
    # the step that samples it: the learner takes those 1.5 steps off the engine's queue +
    # prefill time, which here overstates the rate (4.0x at this commit, since the steps count the
    # sequence's own place in the batch). What it predicts is checked below (capacity).
    assert 5000.0 / 3 < m.prefill_tokens_per_s < 5000.0 * 5
    assert m.step_s(1) == pytest.approx(truth.step_s(1), rel=0.25)
    assert m.step_s(16) == pytest.approx(truth.step_s(16), rel=0.35)
    p_mean, o_mean = learner.mix_means()
    assert p_mean == pytest.approx(400.0, rel=0.1) and o_mean == pytest.approx(120.0, rel=0.1)
    # Capacity in the SLO's terms, learned, within 30 % of the truth's.
    assert policy.capacity_rps == pytest.approx(cap, rel=0.3)
    assert policy.capacity_source == "service-model"


def test_a_backlog_draining_after_arrivals_stop_is_not_read_as_a_slow_prefill():
    # One replica, 128-token prompts, a prompt token costs 1/400 s (a prompt 0.32 s). Twenty
    # steady steps at 1 req/s report queue + prefill times of exactly the M/G/1 queue the learner
    # inverts. Then arrivals stop while a backlog drains at the prefill's own pace (15 requests a
    # 5-s step, each having waited 2 s): those requests waited because of the load they arrived
    # into, not because prefill slowed. Inverted at the step's arrival rate (0) the drain read as a
    # 55 tok/s prefill and, weighing more requests than the steady steps, became the estimate.
    k, p = 1.0 / 400.0, 128.0
    s = p * k
    w = 1.0 * (2 * p * p) * k * k / (2 * (1 - 1.0 * s))   # the learner assumes exponential lengths
    learner = OnlineServiceModel()

    def step(arrival: float, ended: float, queue: float) -> StepObservation:
        return StepObservation(dt=5.0, replicas=1, arrival_rps=arrival, ended=ended, input_tokens=ended * p,
                               output_tokens=ended * 32, prefill_sum=ended * s, prefill_count=ended,
                               queue_sum=ended * queue, queue_count=ended)

    for _ in range(20):
        learner.observe(step(1.0, 5.0, w))
    assert learner.prefill_rate() == pytest.approx(400.0, rel=0.05)
    for _ in range(8):
        learner.observe(step(0.0, 15.0, 2.0))
    assert learner.prefill_rate() == pytest.approx(400.0, rel=0.25)


def _decode_bound_profile():
    # Prefill is nearly free, the step grows by an eighth of its base per sequence (SmolLM2 on
    # these CPUs grows by about a sixteenth): overload shows only as TPOT.
    return ServiceProfile(prefill_tokens_per_s=200_000.0, decode_base_s=0.04, decode_per_seq_s=0.005,
                          kv_capacity_tokens=10_000_000, max_batch=512, step_token_budget=2048,
                          slo=Slo(ttft_s=2.0, tpot_s=0.1))


def test_overload_that_shows_only_as_tpot_raises_desired_replicas():
    profile = _decode_bound_profile()
    mix = TokenMix.from_means(100.0, 100.0)
    cap = profile.slo_capacity_rps(mix, [profile.slo])
    low = _poisson_trace(0.5 * cap, 300, mix.prompt_tokens, mix.output_tokens, seed=3)
    high = _poisson_trace(2.0 * cap, 120, mix.prompt_tokens, mix.output_tokens, seed=4, start=low[0][-1])
    arrivals, p, o = (np.concatenate(x) for x in zip(low, high))
    policy = ForecastPolicy(PolicyConfig(step_seconds=5.0, horizon_seconds=30.0, cold_start_seconds=30.0,
                                         models=("level",)))
    _, decisions = _serve(profile, arrivals, p, o, policy=policy)
    step_at = low[0][-1]
    before = [d for t, d, v in decisions if 120 < t < step_at]
    after = [(t, d, v) for t, d, v in decisions if step_at <= t < step_at + 60]
    assert before and after
    assert max(d.desired_replicas for d in before) == 1
    # Nothing waits: the engine admits everything and the batch grows.
    assert max(v.waiting for _, _, v in after) == 0
    first_two = next(t for t, d, _ in after if d.desired_replicas >= 2)
    assert first_two - step_at <= 15.0, [(round(t - step_at), d.desired_replicas) for t, d, _ in after]
    assert max(d.desired_replicas for _, d, _ in after) >= 2
    # While the batch builds up, the requests ending still meet the SLO (they began before): what
    # one replica served then is no capacity it can keep (read as such, it stated 1.5x the truth).
    assert max(d.capacity_rps for _, d, _ in after) <= 1.15 * cap


def test_at_half_load_the_queue_term_does_not_plan_for_poisson_noise_twice():
    # Half a decode-bound replica's capacity, 1.4 requests a 5-s step. The forecast's per-step
    # bounds are calibrated on counted arrivals, so they hold the Poisson noise of a count; the
    # fluid queue at those bounds, with no queue allowed, asked for a second replica in 9 of this
    # run's 37 decisions after the first two minutes, while the service model's capacity already
    # prices Poisson arrivals' queueing. Its Poisson part is now taken out in quadrature, as the
    # demand term's bound takes it out (demand.without_poisson).
    profile = _decode_bound_profile()
    mix = TokenMix.from_means(100.0, 100.0)
    cap = profile.slo_capacity_rps(mix, [profile.slo])
    arrivals, p, o = _poisson_trace(0.5 * cap, 300, mix.prompt_tokens, mix.output_tokens, seed=5)
    policy = ForecastPolicy(PolicyConfig(step_seconds=5.0, horizon_seconds=30.0, cold_start_seconds=30.0,
                                         models=("level",)))
    _, decisions = _serve(profile, arrivals, p, o, policy=policy)
    settled = [d for t, d, _ in decisions if t > 120]
    assert len(settled) >= 30
    assert not [d.reasons for d in settled if d.desired_replicas > 1 and "queue" in d.reasons]


def test_same_rate_with_four_times_longer_prompts_asks_for_more_replicas(azure_mix):
    prompts, outputs = azure_mix
    slo = H100_70B.slo
    short = np.maximum(1.0, np.round(prompts / 4))       # the Azure mix with prompts a quarter as long
    mix = TokenMix.from_samples(short, outputs)
    rate = 2.5 * H100_70B.slo_capacity_rps(mix, [slo])   # three replicas' worth
    policy = ForecastPolicy(PolicyConfig(step_seconds=5.0, horizon_seconds=30.0, cold_start_seconds=30.0,
                                         models=("level",), scale_down_window_seconds=0.0))
    a1 = _poisson_trace(rate, 400, short, outputs, seed=5)
    a2 = _poisson_trace(rate, 400, short * 4, outputs, seed=6, start=a1[0][-1])
    arrivals, p, o = (np.concatenate(x) for x in zip(a1, a2))
    # Enough replicas that neither phase overloads: the change must come from the model, not a queue.
    _, decisions = _serve(H100_70B, arrivals, p, o, replicas=24, policy=policy)
    shift = a1[0][-1]
    before = [d.desired_replicas for t, d, _ in decisions if shift - 150 < t < shift]
    after = [d.desired_replicas for t, d, _ in decisions if shift + 250 < t < shift + 400]
    longer = H100_70B.slo_capacity_rps(mix.scaled(prompt=4.0), [slo])
    assert max(before) <= 5
    # What the model says four-times-longer prompts need at this rate, within a replica or two.
    expected = math.ceil(rate / longer)
    assert min(after) >= expected - 2 and min(after) > max(before), (before, after, expected)


def test_the_learned_model_its_forecasts_and_their_scores_are_exported(azure_mix):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dashboards import contract
    from forecaster.runner import Runner
    from forecaster.server import ForecastCollector, ForecastState

    prompts, outputs = azure_mix
    mix = TokenMix.from_samples(prompts, outputs)
    rate = 0.6 * H100_70B.slo_capacity_rps(mix, [H100_70B.slo])
    arrivals, p, o = _poisson_trace(rate, 400, prompts, outputs, seed=8)
    policy = ForecastPolicy(PolicyConfig(step_seconds=5.0, horizon_seconds=30.0, cold_start_seconds=30.0,
                                         models=("level",)))
    # Replay the same fleet's samples through the forecaster's own loop (Runner), which publishes
    # and scores: a source that hands out the recorded samples one step at a time.
    samples = []
    _serve(H100_70B, arrivals, p, o, policy=_Recorder(samples))
    state = ForecastState(30.0)

    class Source:
        def __init__(self):
            self.i = 0

        def poll(self, now):
            s = samples[self.i]
            self.i += 1
            return s

        def starting_replicas(self):
            return 0

    runner = Runner(Source(), policy, state, 5.0, clock=lambda: samples[runner.source.i].t)
    for _ in range(len(samples) - 1):
        runner.step()
    registry = CollectorRegistry()
    registry.register(ForecastCollector(state))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    exported = set(families) | {f + "_total" for f in families}
    assert {m.name for m in contract.by_source("forecaster")} <= exported
    d = state.get().decision
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert got[("goodput_replica_capacity_info", (("source", "service-model"),))] == 1.0
    assert got[("goodput_forecast_ttft_seconds", (("bound", "upper"), ("horizon_seconds", "30"),
                                                  ("slo_class", "default")))] == d.ttft_s["default"][1]
    assert got[("goodput_replica_prefill_tokens_per_second", (("bound", "mean"),))] == pytest.approx(
        d.service.model.prefill_tokens_per_s)
    assert got[("goodput_replica_wait_scale", (("state", "learned"),))] == d.service.wait_scale
    assert got[("goodput_replica_wait_scale", (("state", "planned"),))] == d.service.wait_scale_planned
    # The accuracy script reads the capacity planned on from this page.
    accuracy = _accuracy_script()
    assert accuracy.planned_capacity(generate_latest(registry).decode()) == {
        "rps": pytest.approx(d.capacity_rps), "source": "service-model", "read": "live"}
    assert accuracy.planned_capacity(generate_latest(CollectorRegistry()).decode()) is None
    # Scored live: arrival-rate forecasts one horizon later, with their coverage.
    assert runner.scorer.scores["arrival_rate"].num_scored > 50
    assert 0.0 <= got[("goodput_forecast_error_upper_coverage_ratio", (("horizon_seconds", "30"),
                                                                       ("quantity", "arrival_rate")))] <= 1.0
    # The model's mean TTFT forecast is scored against the mean TTFT the sidecars saw one horizon
    # later: at a steady 60 % load it is off by less than the actual on average (measured: 0.58;
    # per-step means of 2k-token prompts over 5 s are noisy, and the model counts 1.5 steps the
    # simulated replica does not have).
    assert runner.scorer.scores["ttft"].relative_error < 1.0


class _Recorder:
    """Stands in for a policy in _serve: records the samples, decides nothing."""

    def __init__(self, out):
        self.out = out

    def observe(self, sample):
        self.out.append(sample)

    def decide(self, t):
        return None


def test_a_prior_from_the_engine_benchmark_or_a_sweep(tmp_path):
    import argparse
    import json

    from forecaster.run_cli import _prior
    from goodput_cli.errors import UsageError

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"model": "smollm2", "engine_decode": [{"batch": 1, "step_s": 0.05},
                                                                        {"batch": 32, "step_s": 0.15}],
                                 "engine_prefill": {"tokens_per_s": 400.0}}))
    prior = _prior(argparse.Namespace(prior=str(bench)))["prior_model"]
    assert prior.prefill_tokens_per_s == 400.0
    assert prior.step_s(1) == pytest.approx(0.05) and prior.step_s(32) == pytest.approx(0.15)
    # Seeded, the learner is ready before it has seen a step, and plans with the prior.
    learner = OnlineServiceModel(prior=prior)
    assert learner.ready and learner.model().step_s(32) == pytest.approx(0.15, rel=0.01)
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"knee": {"rate": 3.0}}))
    assert _prior(argparse.Namespace(prior=str(sweep))) == {"prior_capacity_rps": 3.0}
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    with pytest.raises(UsageError, match="goodput bench engine --json"):
        _prior(argparse.Namespace(prior=str(junk)))


def test_a_calibration_prior_carries_its_overhead_and_its_weight(tmp_path):
    """`goodput demo`'s calibration states the fixed TTFT overhead and how many requests it
    measured; the learner starts from that overhead and weighs the prior as those requests."""
    import argparse
    import json

    from forecaster.run_cli import _prior
    from goodput_cli.errors import UsageError

    data = {"engine_decode": [{"batch": 1, "step_s": 0.06}, {"batch": 8, "step_s": 0.09}],
            "engine_prefill": {"tokens_per_s": 400.0}, "ttft_overhead_s": 0.04, "prior_weight_requests": 15}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    got = _prior(argparse.Namespace(prior=str(path)))
    assert got["prior_weight"] == 15.0 and got["prior_model"].ttft_overhead_s == pytest.approx(0.04)
    learner = OnlineServiceModel(prior=got["prior_model"], prior_weight=got["prior_weight"])
    assert learner.ttft_overhead_s() == pytest.approx(0.04)
    for bad in (0, -1, "many", True):
        path.write_text(json.dumps({**data, "prior_weight_requests": bad}))
        with pytest.raises(UsageError, match="prior_weight_requests"):
            _prior(argparse.Namespace(prior=str(path)))


def _mg1_waits(lam, service, seed=5):
    """Exact FIFO waiting times of a long M/G/1 run (Lindley's recursion, vectorised)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / lam, len(service))
    x = np.concatenate([[0.0], np.cumsum(service[:-1] - gaps[1:])])
    return x - np.minimum(0.0, np.minimum.accumulate(x))


@pytest.mark.parametrize("lam", [0.6, 1.2, 1.6])
def test_prefill_queue_tail_matches_an_exact_mg1_for_constant_and_exponential_prompts(lam):
    # Decode is negligible, so a prompt's TTFT is its M/G/1 wait plus its own 0.5 s on average.
    m = ServiceModel(prefill_tokens_per_s=1000.0, decode_base_s=1e-4, decode_per_seq_s=0.0, kv_capacity_tokens=1e9,
                     max_batch=10**6, step_token_budget=2**30)
    n = 400_000
    constant = np.full(n, 0.5)
    exponential = np.random.default_rng(6).exponential(0.5, n)
    for service, mix in ((constant, TokenMix(np.full(4000, 500.0), np.full(4000, 1.0))),
                         (exponential, TokenMix.from_means(500.0, 1.0))):
        exact = float(np.quantile(_mg1_waits(lam, service) + service, 0.99))
        pred = m.predict(lam, mix)
        predicted = pred.ttft_quantile(0.99) - 1.5 * pred.step_s
        # Measured when written: within 5 % for both. The exponential tail behind the busy
        # probability used before overstated the constant prompts' p99 by 18 % and 11 % at
        # rho = 0.3 and 0.6 (2 % at 0.8), and fails here.
        assert predicted == pytest.approx(exact, rel=0.1), (lam, exact, predicted)


def _accuracy_script():
    return load_script("service_model_accuracy.py")


def test_the_accuracy_script_relearns_from_recorded_scrapes(tmp_path):
    # scripts/service_model_accuracy.py --relearn replays a run's recorded sidecar pages through
    # the forecaster's own parsing and learner; here pages of a fake sidecar whose requests each
    # take 0.2 s of prefill after 0.05 s queued (100 prompt tokens, 10 out), 2 req/s.
    import gzip
    import json

    from prometheus_client import generate_latest

    from tests.forecaster.sidecar_metrics import FakeSidecarMetrics
    from tests.support import free_port

    accuracy = _accuracy_script()
    fake = FakeSidecarMetrics(free_port())
    path = tmp_path / "scrapes.jsonl.gz"
    try:
        # More running than end in a step (10), so the batch cannot have emptied in between and
        # the engine's iteration counters are usable.
        fake.running.labels("m").set(12)
        with gzip.open(path, "wt") as f:
            for i in range(20):
                fake.serve(good=10)
                f.write(json.dumps({"t": 1000.0 + 5 * i, "text": generate_latest(fake.registry).decode()}) + "\n")
    finally:
        fake.stop()
    saved = ServiceModel(prefill_tokens_per_s=1.0, decode_base_s=1.0, decode_per_seq_s=0.0, kv_capacity_tokens=1e6,
                         max_batch=64, step_token_budget=1 << 30)
    model, (p_mean, o_mean), planned = accuracy.relearn(path, saved)
    assert (p_mean, o_mean) == (pytest.approx(100.0), pytest.approx(10.0))
    # And the capacity the replayed policy would plan with: this fake sidecar announces no SLO
    # (no goodput_slo_target_seconds), so there is nothing to plan the model against, and the
    # policy says its capacity is still the prior's.
    assert planned["source"] == "prior" and planned["rps"] > 0 and planned["read"] == "replayed"
    assert model.max_batch == 64 and model.step_token_budget == 1 << 30   # as the run reads them
    # 50 iterations a 5-s step generating 100 tokens: a batch of 2 at 0.1 s an iteration, less the
    # prompts' share of the engine (1,000 tokens at the learned rate).
    assert 0.06 < model.step_s(2) < 0.1
    assert model.prefill_tokens_per_s > 100 / 0.25
    gzip.open(tmp_path / "short.jsonl.gz", "wt").close()
    with pytest.raises(SystemExit, match="too few"):
        accuracy.relearn(tmp_path / "short.jsonl.gz", saved)


@pytest.mark.parametrize("counted_at_prefill", [True, False])
def test_the_decode_step_from_iterations_nets_out_the_prompts_prefilled_in_that_step(counted_at_prefill):
    # One replica decoding a batch of 8 at 0.14 s an iteration, a prompt token 1/400 s. Prompts
    # are prefilled in every other 5-s step (800 tokens: 2 s of it), and the requests they belong
    # to end a step later, so the prompt tokens of the requests that ended fall in the other
    # steps. Netting those out of an iteration's time reads 0.233 s and 0.084 s by turns (the
    # line lands at 0.104 s: the steps ending more requests weigh more); the engine's own count
    # of what it prefilled in the step (goodput_engine_prompt_tokens_computed) gives 0.14 s every
    # step.
    prior = ServiceModel(prefill_tokens_per_s=400.0, decode_base_s=0.1, decode_per_seq_s=0.005,
                         kv_capacity_tokens=1e6, max_batch=64, step_token_budget=1 << 30)
    learner = OnlineServiceModel(prior=prior, prior_weight=0.01)
    for i in range(40):
        prefilled = 800.0 if i % 2 == 0 else 0.0
        ended_prompts = 800.0 - prefilled
        iterations = (5.0 - prefilled / 400.0) / 0.14
        learner.observe(StepObservation(
            dt=5.0, replicas=1, arrival_rps=1.25, ended=ended_prompts / 128 or 0.5, input_tokens=ended_prompts,
            output_tokens=32.0, running=8.0, running_start=8.0, engine_steps=iterations,
            generated_tokens=8.0 * iterations, prefilled_tokens=prefilled if counted_at_prefill else None))
    m = learner.model()
    if counted_at_prefill:
        assert m.step_s(8) == pytest.approx(0.14, rel=0.02)
    else:   # what the learner reads where an engine does not count its prefilled tokens
        assert abs(m.step_s(8) / 0.14 - 1) > 0.05


def test_the_accuracy_script_reads_the_model_the_forecaster_exports():
    # A live run reads the learned model from the forecaster's /metrics: the page here is the
    # forecaster's own exporter (forecaster/server.py) on a learner's parameters.
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from forecaster.server import _service_families

    learned = ServiceModel(prefill_tokens_per_s=380.0, decode_base_s=0.12, decode_per_seq_s=0.008,
                           kv_capacity_tokens=50_000.0, max_batch=256, step_token_budget=512, ttft_overhead_s=0.02)
    learner = OnlineServiceModel(prior=learned)
    params = learner.params()
    decision = SimpleNamespace(cold_start_s=180.0, capacity_source="service-model", service=params)

    class Page:
        def collect(self):
            yield from _service_families(decision)

    registry = CollectorRegistry()
    registry.register(Page())
    accuracy = _accuracy_script()
    model, p_mean, o_mean = accuracy.learned_model(generate_latest(registry).decode())
    m = params.model
    assert model.step_s(1) == pytest.approx(m.step_s(1)) and model.step_s(9) == pytest.approx(m.step_s(9))
    assert model.prefill_tokens_per_s == pytest.approx(m.prefill_tokens_per_s)
    assert model.ttft_overhead_s == pytest.approx(m.ttft_overhead_s)
    assert (p_mean, o_mean) == (pytest.approx(params.prompt_mean), pytest.approx(params.output_mean))
    with pytest.raises(SystemExit, match="had not learned"):
        accuracy.learned_model(generate_latest(CollectorRegistry()).decode())


def test_the_accuracy_script_records_the_dtype_the_engine_runs():
    # The engine's own exporter (engine/config_info.py): `--dtype auto` picks bfloat16 on a CPU
    # with AMX and float32 elsewhere, and runs in different dtypes do not compare.
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from engine.config_info import export_config_info
    from engine.dtype import DtypeChoice

    registry = CollectorRegistry()
    engine = SimpleNamespace(cfg=SimpleNamespace(block_size=16, enable_prefix_caching=True, device="cpu"),
                             dtype="bfloat16", num_blocks=64,
                             dtype_choice=DtypeChoice("bfloat16", "auto", "cpu_bf16_faster", "measured"))
    export_config_info(registry, "smollm2", engine)
    accuracy = _accuracy_script()
    assert accuracy.engine_dtype(generate_latest(registry).decode()) == "bfloat16"
    assert accuracy.engine_dtype(generate_latest(CollectorRegistry()).decode()) is None


def test_the_accuracy_script_runs_each_rate_long_enough_for_its_requests():
    accuracy = _accuracy_script()
    assert accuracy.rate_durations("0.2,1, 4", 60.0, 100) == [(0.2, 500.0), (1.0, 100.0), (4.0, 60.0)]
    for bad in ("", "0,1", "-1", "a"):
        with pytest.raises(ValueError, match="positive req/s"):
            accuracy.rate_durations(bad, 60.0, 100)


def _small_profile(single=None):
    # SmolLM2 on a CPU, roughly: 80 ms + 10 ms a sequence, prompts at 1,000 tokens/s, 64 sequences
    # at most; saturated at 2.23 req/s of 128-token prompts and 32-token answers.
    return ServiceProfile(prefill_tokens_per_s=1000.0, decode_base_s=0.08, decode_per_seq_s=0.01,
                          kv_capacity_tokens=1e6, max_batch=64, step_token_budget=512, decode_single_s=single,
                          slo=Slo(ttft_s=3.0, tpot_s=0.5))


def _simulated_tpot(profile, rate, prompts, outputs, seconds=1500.0, seed=1):
    arrivals, p, o = _poisson_trace(rate, seconds, prompts, outputs, seed=seed)
    fleet, _ = _serve(profile, arrivals, p, o)
    multi = np.isfinite(fleet.t_done) & (fleet.arrival > 150) & (fleet.output > 1)
    return ((fleet.t_done - fleet.t_first) / np.maximum(fleet.output - 1, 1))[multi]


def _tpot_quantile_errors(profile, lengths, rates):
    """Relative errors of the predicted TPOT p50/p90/p99 against the simulated replica's."""
    if lengths == "constant":
        prompts, outputs = np.full(100, 128.0), np.full(100, 32.0)
    else:
        mix = TokenMix.from_means(128.0, 32.0)
        prompts, outputs = mix.prompt_tokens, mix.output_tokens
    mix = TokenMix.from_samples(prompts, outputs)
    errors = []
    for rate in rates:
        tpot = _simulated_tpot(profile, rate, prompts, outputs)
        pred = profile.predict(rate, mix)   # a simulated replica is a ServiceModel
        for q in (0.5, 0.9, 0.99):
            errors.append(abs(pred.tpot_quantile(q) - np.quantile(tpot, q)) / np.quantile(tpot, q))
    return errors


@pytest.mark.parametrize("lengths", ["constant", "exponential"])
def test_tpot_quantiles_follow_the_load_over_each_request_life(lengths):
    # From a quarter of saturation to 90 % of it. With every request stepping in the mean batch,
    # TPOT p99 came out at 0.284 s against 0.515 s simulated at 1.5 req/s (constant lengths) and the
    # errors' median was 12 %; with the batch following each request's local load, measured when
    # written: largest 21 % (p90 at 1.5 req/s, over), median 4 %.
    errors = _tpot_quantile_errors(_small_profile(), lengths, (0.5, 1.0, 1.5, 2.0))
    assert max(errors) < 0.3, errors
    assert float(np.median(errors)) < 0.1, errors


def test_decode_bound_capacity_is_where_the_simulated_replica_meets_the_objective():
    # TPOT objective 0.1 s on a step of 40 ms + 5 ms a sequence. The mean batch alone put the SLO
    # capacity at 1.20 req/s, where the simulated replica serves a third of the requests in time.
    profile = _decode_bound_profile()
    mix = TokenMix.from_means(100.0, 100.0)
    multi = mix.output_tokens > 1
    for rate in (0.6, 0.9, 1.2):
        tpot = _simulated_tpot(profile, rate, mix.prompt_tokens, mix.output_tokens, seconds=3000.0, seed=3)
        pred = profile.predict(rate, mix)
        predicted = float(np.mean(pred.tpot_s[multi] <= profile.slo.tpot_s))
        assert predicted == pytest.approx(float(np.mean(tpot <= profile.slo.tpot_s)), abs=0.05), rate
    assert 0.5 < profile.slo_capacity_rps(mix, [profile.slo]) < 0.7


def test_capacity_is_planned_on_the_steep_end_of_a_slope_the_batches_barely_show():
    # At 30 % of capacity the batch swings between 0 and 3: the fitted slope read 3.7 ms where the
    # replica's is 5, and its capacity 0.90 req/s against 0.57. The planning model turns the line
    # about the batches seen to the steep end of the slope's band; once load has varied over a
    # day, the band is narrow and planning is the fitted model.
    profile = _decode_bound_profile()
    mix = TokenMix.from_means(100.0, 100.0)
    cap = profile.slo_capacity_rps(mix, [profile.slo])
    low = _learn_over_phases(profile, [0.3 * cap], 300, mix.prompt_tokens, mix.output_tokens).service
    fitted, planning = (m.slo_capacity_rps(mix, [profile.slo]) for m in (low.model(), low.planning_model()))
    assert planning <= fitted
    assert 0.7 * cap < planning < 1.1 * cap, (cap, fitted, planning)
    # At the batches seen the planning line is the fitted one.
    b = low._decode_line().fit(low.num_steps, floor_a=1e-4).x_mean
    line = [m.decode_base_s + m.decode_per_seq_s * b for m in (low.model(), low.planning_model())]
    assert line[1] == pytest.approx(line[0], rel=1e-6)
    day = _learn_over_phases(profile, [s * cap for s in (0.2, 0.5, 0.9, 0.35, 0.7)], 240,
                             mix.prompt_tokens, mix.output_tokens).service
    fitted, planning = (m.slo_capacity_rps(mix, [profile.slo]) for m in (day.model(), day.planning_model()))
    assert planning == pytest.approx(fitted, rel=0.05)
    assert planning == pytest.approx(cap, rel=0.1)


@pytest.mark.parametrize("single", [0.04, None])
def test_the_step_of_one_sequence_alone_is_learned_apart_from_the_line(single):
    # A CPU runs a one-row product as a matrix-vector kernel: SmolLM2's step alone measured 59 ms
    # against 112 ms for two. Learned from TPOT at low load; on a replica whose step is on the line,
    # the estimate stays on it.
    profile = _small_profile(single)
    mix = TokenMix.from_means(128.0, 32.0)
    policy = _learn_over_phases(profile, (0.2, 1.0, 0.3, 2.0, 0.2), 300, mix.prompt_tokens, mix.output_tokens)
    m = policy.service.model()
    assert m.single_step_s == pytest.approx(profile.single_step_s, rel=0.15)
    assert m.step_s(8) == pytest.approx(profile.step_s(8), rel=0.15)
    tpot = _simulated_tpot(profile, 0.2, mix.prompt_tokens, mix.output_tokens, seconds=1200.0, seed=9)
    assert m.predict(0.2, mix).tpot_quantile(0.5) == pytest.approx(float(np.median(tpot)), rel=0.15)


def test_the_step_alone_joins_the_line_at_two_sequences():
    m = ServiceModel(prefill_tokens_per_s=1000.0, decode_base_s=0.08, decode_per_seq_s=0.01, kv_capacity_tokens=1e6,
                     max_batch=64, step_token_budget=512, decode_single_s=0.04)
    assert m.step_s(1) == pytest.approx(0.04)
    assert m.step_s(1.5) == pytest.approx(0.07)
    assert m.step_s(2) == pytest.approx(0.10) and m.step_s(6) == pytest.approx(0.14)
    assert replace(m, decode_single_s=None).step_s(1) == pytest.approx(0.09)
    with pytest.raises(ValueError, match="decode_single_s"):
        replace(m, decode_single_s=0.0)


def _concave_profile(single=None):
    # A CPU's step: 50 ms + 2 ms a sequence + 60 ms·ln(batch), about what SmolLM2 measured on the
    # EPYC (59 / 112 / 164 / 208 ms at 1 / 2 / 6 / 12 sequences), optionally 50 ms alone.
    return replace(_small_profile(single), decode_base_s=0.05, decode_per_seq_s=0.002, decode_log_s=0.06)


@pytest.mark.parametrize("lengths", ["constant", "exponential"])
def test_tpot_quantiles_on_a_concave_step_follow_the_simulated_replica(lengths):
    # Measured when written: largest error 15 % (constant) and 17 % (exponential), medians 1.5
    # and 5.3 %, over p50/p90/p99 at 0.2-2 req/s.
    errors = _tpot_quantile_errors(_concave_profile(), lengths, (0.2, 1.0, 2.0))
    assert max(errors) < 0.25, errors
    assert float(np.median(errors)) < 0.1, errors


@pytest.mark.parametrize("concave", [True, False])
def test_a_concave_step_is_learned_and_a_straight_one_stays_straight(concave):
    profile = _concave_profile(0.05) if concave else _small_profile()
    mix = TokenMix.from_means(128.0, 32.0)
    policy = _learn_over_phases(profile, (0.2, 1.0, 0.3, 2.0, 0.2), 300, mix.prompt_tokens, mix.output_tokens)
    m = policy.service.model()
    # Where the traffic ran (up to about 8 sequences), the learned step is within 20 %. Measured
    # when written: concave -1 / +14 / +8 / +9 % at 1 / 2 / 4 / 8 sequences; straight -2 / -2 /
    # +4 / +11 % (its slope is overstated: the prefill rate this simulated replica's short prompts
    # give the learner is too fast, which leaves prompt time in the iteration steps).
    for b in (1, 2, 4, 8):
        assert m.step_s(b) == pytest.approx(profile.step_s(b), rel=0.2), b
    if concave:
        assert m.decode_log_s > 0.02
    else:
        assert m.decode_log_s * math.log(8) < 0.05 * m.step_s(8)
    params = policy.service.params()
    assert params.decode_log_s[0] <= m.decode_log_s <= params.decode_log_s[1]


def test_the_mean_log_of_a_poisson_count_and_the_batch_on_a_concave_step():
    from scipy.stats import poisson

    from forecaster.service_model import log_one_plus_poisson, log_one_plus_poisson_slope, seen_step_s

    for m in (0.0, 0.01, 0.7, 3.0, 40.0, 255.0, 300.0, 2000.0):
        k = np.arange(0, int(m + 30 * math.sqrt(m) + 60))
        pmf = poisson.pmf(k, m)
        assert float(log_one_plus_poisson(m)) == pytest.approx(float(pmf @ np.log1p(k)), abs=1e-4)
        assert float(log_one_plus_poisson_slope(m)) == pytest.approx(float(pmf @ np.log1p(1.0 / (1.0 + k))), abs=1e-4)
    profile = _concave_profile(0.05)
    mix = TokenMix.from_means(128.0, 32.0)
    for rate in (0.1, 0.8, 1.6):
        pred = profile.predict(rate, mix)
        rho_p = rate * mix.prompt_mean / profile.prefill_tokens_per_s
        seen = seen_step_s(profile.decode_base_s + profile.decode_per_seq_s, profile.decode_per_seq_s, 0.05, pred.batch,
                           profile.decode_log_s)
        # Little's law with the step a decoding sequence sees: B = λŌ·seen(B) / (1 − ρ_p).
        assert pred.batch == pytest.approx(rate * mix.output_mean * seen / (1.0 - rho_p), rel=1e-6)
        assert pred.step_s == pytest.approx(seen, rel=1e-9)
    with pytest.raises(ValueError, match="decode_log_s"):
        replace(profile, decode_log_s=-0.01)


def test_the_step_curve_fit_recovers_a_curve_and_keeps_its_terms_non_negative():
    from forecaster.robust_line import RobustLine

    fit_line = RobustLine(forget=1.0)
    for i, b in enumerate((1.0, 2.0, 3.0, 5.0, 8.0, 13.0)):
        fit_line.add(b, 0.05 + 0.002 * b + 0.06 * math.log(b), 1.0, i, math.log(b))
    fit = fit_line.fit(6)
    assert (fit.a, fit.c, fit.d) == pytest.approx((0.05, 0.002, 0.06), rel=1e-6)
    # A step that falls with the batch (noise, a transient) is held flat, not fitted downhill.
    falling = RobustLine(forget=1.0)
    for i, b in enumerate((1.0, 2.0, 4.0, 8.0)):
        falling.add(b, 0.2 - 0.01 * b, 1.0, i, math.log(b))
    fit = falling.fit(4)
    assert fit.c == 0.0 and fit.d == 0.0 and 0.12 <= fit.a <= 0.19   # the points' level (Huber-weighted)
    # Points on a line fit a line (the ridge holds the concave part at the prior's 0).
    straight = RobustLine(forget=1.0)
    straight.set_prior((1.0, 4.0), 0.1, 0.01, 2.0)
    for i, b in enumerate((1.0, 2.0, 4.0, 8.0)):
        straight.add(b, 0.1 + 0.01 * b, 5.0, i)
    fit = straight.fit(4)
    assert fit.d == pytest.approx(0.0, abs=1e-12) and fit.c == pytest.approx(0.01, rel=1e-6)


def test_planning_never_states_more_capacity_than_the_fitted_model():
    # Turned about the mean batch, the planning line runs under the fitted one at smaller batches;
    # where the SLO's edge lies there, planning alone would state more than the fitted model (a
    # replay of the SmolLM2 scrapes read 2 % over). The policy takes the smaller of the two.
    profile = _decode_bound_profile()
    mix = TokenMix.from_means(100.0, 100.0)
    cap = profile.slo_capacity_rps(mix, [profile.slo])
    policy = _learn_over_phases(profile, [s * cap for s in (0.2, 0.5, 0.9, 0.35, 0.7)], 240,
                                mix.prompt_tokens, mix.output_tokens)
    service = policy.service
    # The policy plans on the mix it learned (the sidecars' token histograms), not on `mix`.
    fitted, learned_mix = service.model(), service.mix()
    fitted_cap = fitted.slo_capacity_rps(learned_mix, policy.slos)
    # The edge the bisection found: the predicted TPOT p99 climbs with the rate in stairs (the
    # batch's distribution moves by whole sequences; 0.63 req/s missed here where 0.64 met), so
    # the edge is judged 5 % either side.
    assert fitted.meets_slo(0.95 * fitted_cap, learned_mix, policy.slos)
    assert not fitted.meets_slo(1.05 * fitted_cap, learned_mix, policy.slos)
    # A planning line flatter than the fit (the case the pivot makes below the mean batch).
    optimistic = replace(fitted, decode_per_seq_s=0.5 * fitted.decode_per_seq_s)
    assert optimistic.slo_capacity_rps(learned_mix, policy.slos) > 1.2 * fitted_cap
    service.planning_model = lambda m=None: optimistic
    policy._capacity_cache = None
    # Never more than the fitted model states; bisected below the planned rate, the edge it finds
    # may be another stair of the same edge (within the 5 % above).
    assert 0.95 * fitted_cap <= policy.capacity_rps <= fitted_cap * (1 + 1e-3)


def _clumped_trace(rate, seconds, prompts, outputs, mean_clump=3.0, spread_s=0.02, seed=1):
    """Requests in clumps (a client firing several at once): clumps arrive as a Poisson process,
    each a geometric count of requests (mean `mean_clump`: index of dispersion 2·mean − 1) within
    `spread_s` of each other."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(mean_clump / rate, int(rate * seconds / mean_clump)))
    sizes = rng.geometric(1.0 / mean_clump, len(starts))
    arrivals = np.sort(np.repeat(starts, sizes) + rng.uniform(0.0, spread_s, int(sizes.sum())))
    pick = rng.integers(0, len(prompts), len(arrivals))
    return arrivals, np.asarray(prompts, float)[pick], np.asarray(outputs, float)[pick]


def test_clumped_arrivals_are_learned_and_queued_as_clumps(azure_mix):
    """Requests arriving in clumps of three on average (index of dispersion 5) at half a replica's
    Poisson capacity: the online learner reads the clumping from the per-window arrival counters
    (as the sidecars export them) and the prefill rate through it, and the model it learned
    predicts the simulated replica's TTFT where the same model taking arrivals as Poisson is off
    by more than half. (Measured when written: dispersion 4.7, prefill 20,100 tok/s against
    20,000.)"""
    prompts, outputs = azure_mix
    mix = TokenMix.from_samples(prompts, outputs)
    rate = 0.4 * H100_70B.slo_capacity_rps(mix, [H100_70B.slo])
    arrivals, p, o = _clumped_trace(rate, 1200, prompts, outputs)
    # At the forecaster's default 15-s step (at 5-s steps, a step holds a clump or two, and the
    # median of the steps' prefill estimates reads 15-22 % fast).
    policy = ForecastPolicy(PolicyConfig(step_seconds=15.0, horizon_seconds=60.0, cold_start_seconds=60.0))
    fleet, _ = _serve(H100_70B, arrivals, p, o, policy=policy, sample_every=15.0)
    learned = policy.service.model()
    assert 3.5 < learned.arrival_dispersion < 6.5, policy.service.clumping.by_window()
    assert learned.prefill_tokens_per_s == pytest.approx(H100_70B.prefill_tokens_per_s, rel=0.15)
    done = np.isfinite(fleet.t_done) & (fleet.arrival > 150)
    ttft = (fleet.t_first - fleet.arrival)[done]
    clumped = learned.predict(rate, mix)
    poisson = replace(learned, arrival_dispersion=1.0).predict(rate, mix)
    for q in (0.5, 0.99):
        measured = float(np.quantile(ttft, q))
        assert clumped.ttft_quantile(q) == pytest.approx(measured, rel=0.25), q
        assert poisson.ttft_quantile(q) < 0.6 * measured, q
    # Clumps cost capacity: the share of requests in time at this rate falls, as measured.
    assert clumped.good_share(H100_70B.slo) < poisson.good_share(H100_70B.slo)


def test_clumps_of_about_one_predict_as_poisson_and_the_dispersion_is_read_at_the_prompt_queue_time_scale(azure_mix):
    from forecaster.prompt_queue import dispersion_at

    prompts, outputs = azure_mix
    mix = TokenMix.from_samples(prompts, outputs)
    # The clumped queue (M^X/G/1, its own draws) at an index barely over 1 is the Poisson one.
    # Each prediction is a Monte Carlo draw: one seed's pair differed by up to 7 % at the TTFT p99
    # (and passed a 2 % bound on one seed only by chance), so the ratios are averaged over five
    # seeds. Measured when written: TTFT p50 and p90 within 1.5 %, p99 within 3.4 % (the clumped
    # tail a little heavier), TPOT p50 within 0.3 %, p99 within 0.8 %.
    seeds = (11, 12, 13, 14, 15)
    for rate in (1.5, 3.0, 4.5):
        pairs = [(H100_70B.predict(rate, mix, seed=s), replace(H100_70B, arrival_dispersion=1.001).predict(rate, mix, seed=s))
                 for s in seeds]

        def ratio(quantile):
            return float(np.mean([quantile(near) / quantile(poisson) for poisson, near in pairs]))

        for q, tolerance in ((0.5, 0.02), (0.9, 0.02), (0.99, 0.05)):
            assert ratio(lambda p: p.ttft_quantile(q)) == pytest.approx(1.0, abs=tolerance), (rate, q)
        assert ratio(lambda p: p.tpot_quantile(0.5)) == pytest.approx(1.0, abs=0.02), rate
        assert ratio(lambda p: p.tpot_quantile(0.99)) == pytest.approx(1.0, abs=0.08), rate
    # Interpolated in log(window) between the windows measured, flat past them, never under 1.
    windows = {0.1: 2.0, 1.0: 4.0, 10.0: 8.0}
    assert dispersion_at(math.sqrt(0.1), windows) == pytest.approx(3.0)
    assert dispersion_at(0.01, windows) == 2.0 and dispersion_at(60.0, windows) == 8.0
    assert dispersion_at(0.5, {0.1: 0.7, 1.0: 0.9}) == 1.0 and dispersion_at(0.5, {}) == 1.0
    with pytest.raises(ValueError, match="arrival_dispersion"):
        replace(H100_70B, arrival_dispersion=0.5)


def test_the_accuracy_script_predicts_at_the_rate_the_sweep_offered(tmp_path):
    # A sweep's Poisson schedule realises its own rate (its requests over its span): the seeds the
    # script passes gave 3.51 req/s at a nominal 4. The model is asked about what the engine was
    # offered, and a report without it (older runs) falls back to the nominal rate.
    import argparse
    import json

    accuracy = _accuracy_script()
    model = ServiceModel(prefill_tokens_per_s=900.0, decode_base_s=0.06, decode_per_seq_s=0.0015,
                         kv_capacity_tokens=1e6, max_batch=64, step_token_budget=512)
    measured = {"ttft p50": 0.4, "ttft p99": 1.0, "tpot p50": 0.2, "tpot p99": 0.26}
    points = [{"rate": 4.0, "offered_rate": 3.515, "attainment": 1.0, "requests": 240, "measured": measured},
              {"rate": 2.0, "attainment": 1.0, "requests": 120, "measured": measured}]
    args = argparse.Namespace(input_tokens=128, output_tokens=32, model="m")
    accuracy._report(args, tmp_path, model, 128.0, 32.0, points, (0.1, 0.1, 0.1), "float32")
    rows = json.loads((tmp_path / "m_accuracy.json").read_text())["rows"]
    mix = TokenMix(np.full(4000, 128.0), np.full(4000, 32.0))
    for row, rate in zip(rows, (3.515, 2.0)):
        assert row["predicted"]["sweep mix"]["tpot p50"] == pytest.approx(model.predict(rate, mix).tpot_quantile(0.5))
    assert rows[0]["offered_rate"] == 3.515 and rows[1]["offered_rate"] is None
    assert "| 4 | 3.515 | 240 |" in (tmp_path / "m_accuracy.md").read_text()


def _heavy_mix(seed=3, n=5000):
    """Long, heavy-tailed prompts (mean about 11,500 tokens, p99 about 70,000), like Mooncake's."""
    rng = np.random.default_rng(seed)
    return (np.minimum(126_000, np.round(rng.lognormal(np.log(7000), 1.0, n))),
            np.maximum(1, np.round(rng.lognormal(np.log(250), 0.8, n))))


@pytest.mark.parametrize("seed", [2])
def test_a_load_aware_router_is_learned_as_a_wait_scale_and_a_random_one_is_not(monkeypatch, seed):
    """16 replicas at 30 % of their prefill, heavy-tailed prompts, Poisson arrivals. Behind the
    least-outstanding router prompts wait less than in each replica's own queue (a long prompt's
    replica gets the next requests last); at random they do not. The learner reads that from the
    engines' queue time on calm steps: a scale under 1 for the first (0.60-0.70 over seeds 1-3 and
    5 when written), 1 for the second. With it, the model's share of requests in time at the
    fleet's rate is closer to what the fleet served, and capacity is planned on it only while no
    burst is in memory."""
    import forecaster.simulate.fleet as fleet_module

    prompts, outputs = _heavy_mix()
    replicas = 16
    rate = replicas * 0.3 * H100_70B.prefill_tokens_per_s / prompts.mean()
    learned = {}
    for router in ("least-outstanding", "random"):
        real = fleet_module.RequestFleet
        monkeypatch.setattr(sys.modules[__name__], "RequestFleet",
                            lambda *a, **k: real(*a, router=router, **k))
        arrivals, p, o = _poisson_trace(rate, 1200, prompts, outputs, seed=seed)
        policy = ForecastPolicy(PolicyConfig(step_seconds=15.0, horizon_seconds=60.0, cold_start_seconds=60.0))
        fleet, _ = _serve(H100_70B, arrivals, p, o, replicas=replicas, tick=0.1, policy=policy, sample_every=15.0)
        monkeypatch.undo()
        assert policy._calm   # Poisson arrivals: no burst in memory
        done = np.isfinite(fleet.t_done)
        served = float(np.mean((fleet.t_first - fleet.arrival)[done] <= H100_70B.slo.ttft_s))
        learned[router] = (policy, policy.service.model(), served)
    policy, model, served = learned["least-outstanding"]
    assert model.wait_scale < 0.8
    assert learned["random"][1].wait_scale > 0.95
    mix = policy.service.mix()
    scaled = model.predict(rate / replicas, mix).good_share(H100_70B.slo)
    unscaled = replace(model, wait_scale=1.0).predict(rate / replicas, mix).good_share(H100_70B.slo)
    assert abs(scaled - served) < abs(unscaled - served)
    # Planned on while calm; with a burst in memory, as the replicas' own queues.
    calm = policy.capacity_rps
    policy._calm, policy._capacity_cache = False, None
    assert policy.capacity_rps < calm


def test_the_wait_scale_learns_only_from_calm_steps_and_only_once_it_has_seen_enough():
    learner = OnlineServiceModel(prior=H100_70B)
    # One replica at about half its prefill, prompts waiting a hundredth of what its own queue says.
    step = StepObservation(dt=15.0, replicas=1, arrival_rps=1.0, ended=15, input_tokens=15 * 8000.0,
                           output_tokens=15 * 200.0, ttft_sum=15 * 0.6, ttft_count=15, tpot_sum=15 * 0.03,
                           tpot_count=15, prefill_sum=15 * 0.45, prefill_count=15, queue_sum=15 * 0.005,
                           queue_count=15)
    for _ in range(40):
        learner.observe(step, calm=False)
    assert learner.wait_scale() == 1.0 and learner.model().wait_scale == 1.0
    for i in range(20):
        learner.observe(step, calm=True)
        if i < 12:   # 12 steps of 15 requests are under the 200 needed (14, forgotten a little, are not)
            assert learner.wait_scale() == 1.0, i
    assert learner.wait_scale() < 0.1
    assert learner.model().wait_scale == learner.wait_scale()
    # Waits longer than the model's never raise it past 1: bursts are the burst floor's.
    slow = replace(step, queue_sum=15 * 30.0)
    for _ in range(400):
        learner.observe(slow, calm=True)
    assert learner.wait_scale() == 1.0
