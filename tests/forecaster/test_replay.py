"""`forecaster run --record` and `forecaster replay`: the recorded inputs read back exactly, and a
replay decides what the live loop decided on them."""

import argparse
import json
import math
import subprocess
from pathlib import Path

import numpy as np

from forecaster.policy import FleetSample, ForecastPolicy, PolicyConfig
from forecaster.replay import Recorder, read_recording, replay, sample_from_json, sample_to_json
from forecaster.run_cli import policy_config
from forecaster.runner import Runner
from forecaster.server import ForecastState
from forecaster.service_model import Slo
from tests.support import goodput_command


def _full_sample(t: float, arrivals: float) -> FleetSample:
    """Every field set, the awkward ones included (infinite bucket bounds, NaN usage, SLOs)."""
    return FleetSample(
        t=t, arrivals_total=arrivals, input_tokens_total=300.0 * arrivals, output_tokens_total=40.0 * arrivals,
        in_flight=3.0, queue_waiting=1.0, running=2.5, kv_cache_usage=math.nan, preemptions_total=0.0,
        ready_replicas=2, good_total=0.9 * arrivals, ended_total=arrivals - 3, ttft_sum_total=0.4 * arrivals,
        ttft_count_total=arrivals - 3, tpot_sum_total=0.05 * arrivals, tpot_count_total=arrivals - 3,
        decode_batch_total=2.0 * arrivals, decode_batch_count_total=arrivals, prefill_sum_total=0.1 * arrivals,
        prefill_count_total=arrivals, queue_sum_total=0.2 * arrivals, queue_count_total=arrivals,
        generation_tokens_total=40.0 * arrivals, engine_steps_total=20.0 * arrivals,
        prompt_computed_total=290.0 * arrivals,
        input_token_hist_total={128.0: 0.2 * arrivals, 512.0: 0.9 * arrivals, math.inf: arrivals},
        output_token_hist_total={64.0: 0.7 * arrivals, math.inf: arrivals},
        arrivals_squared_total={0.1: 1.5 * arrivals, 1.0: 4.0 * arrivals, 10.0: 30.0 * arrivals},
        slos=(Slo(3.0, 0.5, 0.99, "interactive"), Slo(10.0, 1.0, 0.9, "batch")))


def _same(a: FleetSample, b: FleetSample) -> bool:
    def norm(x):
        return "nan" if isinstance(x, float) and math.isnan(x) else x
    return all(norm(getattr(a, f)) == norm(getattr(b, f)) for f in a.__dataclass_fields__)


def test_a_sample_reads_back_exactly_through_strict_json():
    s = _full_sample(12.5, 100.0)
    text = json.dumps(sample_to_json(s), allow_nan=False)   # no NaN/Infinity tokens: any JSON reader takes it
    back = sample_from_json(json.loads(text))
    assert _same(s, back) and math.isnan(back.kv_cache_usage) and back.slos == s.slos
    assert back.input_token_hist_total[math.inf] == 100.0


class _ListSource:
    def __init__(self, samples):
        self.samples = list(samples)

    def poll(self, now):
        return self.samples.pop(0)

    def starting_replicas(self):
        return 1


def _samples(n: int):
    rng = np.random.default_rng(5)
    arrivals, out = 0.0, []
    for k in range(n):
        rate = 3.0 if k < 40 else 9.0   # a step up the policy must answer
        arrivals += rng.poisson(rate * 2.0)
        out.append(FleetSample(t=2.0 * k, arrivals_total=arrivals, input_tokens_total=0.0, output_tokens_total=0.0,
                               in_flight=float(rng.poisson(rate)), queue_waiting=0.0, running=0.0,
                               kv_cache_usage=0.1, preemptions_total=0.0, ready_replicas=1, good_total=arrivals))
    return out


def _config():
    return PolicyConfig(step_seconds=2.0, horizon_seconds=20.0, cold_start_seconds=20.0, capacity_rps=2.0,
                        scale_down_window_seconds=10.0, models=("level", "naive"), refit_every_seconds=20.0)


def test_replay_decides_what_the_live_loop_decided(tmp_path):
    samples = _samples(80)
    path = tmp_path / "steps.jsonl"
    live_policy = ForecastPolicy(_config())
    runner = Runner(_ListSource(samples), live_policy, ForecastState(20.0), 2.0,
                    clock=iter([s.t for s in samples]).__next__, recorder=Recorder(path))
    live = [runner.step().desired_replicas for _ in samples]
    runner.recorder.close()
    live_policy.close()
    assert max(live) >= 4 > min(live)   # the step up moved the count: the comparison has something to show
    again = ForecastPolicy(_config())
    replayed = [d.desired_replicas for _, d in replay(again, read_recording(path))]
    again.close()
    assert replayed == live


def test_replay_cli_prints_each_decision_and_names_a_bad_line(tmp_path):
    path = tmp_path / "steps.jsonl"
    rec = Recorder(path)
    for s in _samples(30):
        rec.write(s.t, s, 0)
    rec.close()
    flags = ["--step", "2", "--horizon", "20", "--cold-start", "20", "--capacity", "2", "--models", "naive"]
    with open(path, "a") as fh:
        fh.write('{"t": 60, "sample": {"t": 6')   # a recording cut short mid-line
    done = subprocess.run(goodput_command("forecaster", "replay", str(path), *flags), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 31 and lines[0].split()[:3] == ["0.0", "s", "desired=1"]
    assert lines[-1].startswith("30 steps decided; desired replicas 1-")
    # A damaged line in the middle is an error naming it, not a silent skip.
    text = path.read_text().splitlines()
    text[5] = "not json"
    path.write_text("\n".join(text[:-1]) + "\n")
    done = subprocess.run(goodput_command("forecaster", "replay", str(path), *flags), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and f"{path}:6: not a recorded step" in done.stderr, done.stderr
    done = subprocess.run(goodput_command("forecaster", "replay", str(tmp_path / "missing.jsonl"), *flags),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no such recording" in done.stderr, done.stderr
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    done = subprocess.run(goodput_command("forecaster", "replay", str(tmp_path / "bad.jsonl.gz"), *flags),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not readable" in done.stderr, done.stderr


DATA = Path(__file__).parent / "data"


def test_recorded_demo_stays_at_one_at_half_load_and_rises_within_two_steps_of_the_burst():
    """A real `goodput demo` (SmolLM2 on a 2-core AMD EPYC, 2026-12-07), its forecaster's steps
    recorded, decided again with the demo's flags and its calibration as the prior. The calibration
    measured the decode step at 1, 8 and 32 sequences; the under phase ran batches of 10-24, above
    the batches 1 and 4 the prior's evidence used to sit at, so its first few steps swung the slope
    (3 → 5 ms a sequence) and the count went to 2 for 10 s at half load. With the prior's evidence
    where it was measured, the count stays 1 until the burst (40 s) and reaches 2 or more at the
    first step after it."""
    args = argparse.Namespace(step=2.0, horizon=30.0, cold_start=30.0, capacity=None, capacity_from=None,
                              prior=str(DATA / "demo-smollm2-epyc.calibration.json"), target_queue=0.0,
                              min_replicas=1, max_replicas=16, scale_down_window=15.0, fit_timeout=2.0,
                              refit_every=300.0, models="level,holt_winters")
    config = policy_config(args, background_selection=False)
    assert config.prior_batches == (1.0, 8.0, 32.0)
    policy = ForecastPolicy(config)
    rows = [(float(line["t"]), d.desired_replicas) for line, d in
            replay(policy, read_recording(DATA / "demo-smollm2-epyc.steps.jsonl.gz"))]
    policy.close()
    t0 = rows[0][0]
    under = [n for t, n in rows if t - t0 < 40.0]
    assert len(under) == 20 and max(under) == 1, under
    first_up = next(t - t0 for t, n in rows if t - t0 >= 40.0 and n >= 2)
    assert first_up <= 42.5, first_up


def test_a_sample_with_numpy_numbers_records_and_a_recording_that_fails_costs_no_decision(tmp_path, caplog):
    s = _full_sample(3.0, 10.0)
    s.ready_replicas = np.int64(2)   # what a source computing with numpy may hand over
    s.in_flight = np.float64(4.0)
    rec = Recorder(tmp_path / "steps.jsonl")
    rec.write(s.t, s, np.int64(1))
    rec.close()
    [line] = list(read_recording(tmp_path / "steps.jsonl"))
    assert line["sample"].ready_replicas == 2 and line["starting"] == 1
    # A recorder that fails (here: its file closed under it) stops, said once; every step still decides.
    samples = _samples(6)
    runner = Runner(_ListSource(samples), ForecastPolicy(_config()), ForecastState(20.0), 2.0,
                    clock=iter([x.t for x in samples]).__next__, recorder=Recorder(tmp_path / "gone.jsonl"))
    runner.recorder.close()
    assert all(runner.step() is not None for _ in samples)
    assert runner.recorder is None and "recording to" in caplog.text
    runner.policy.close()
