"""`goodput simulate` end to end on a small trace, and the oracle's plan."""

from __future__ import annotations

import json
import subprocess
from collections import deque

import numpy as np
import pytest

from forecaster.simulate.oracle import oracle_plan, required_replicas
from tests.support import goodput_command


def _write_azure_csv(path, seconds=600, seed=0):
    # 2 req/s for 5 minutes, then 20 req/s: short prompts so the run takes a few seconds.
    rng = np.random.default_rng(seed)
    t = np.concatenate([np.sort(rng.uniform(0, 300, 600)), np.sort(rng.uniform(300, seconds, 6000))])
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for s in t:
        whole = int(s)
        frac = int(round((s - whole) * 1e7))
        if frac == 10_000_000:
            whole, frac = whole + 1, 0
        lines.append(f"2023-11-16 18:{whole // 60:02d}:{whole % 60:02d}.{frac:07d},{rng.integers(100, 3000)},{rng.integers(5, 40)}")
    path.write_text("\n".join(lines))


def test_simulate_writes_a_table_and_json(tmp_path):
    trace = tmp_path / "trace.csv"
    _write_azure_csv(trace)
    out = tmp_path / "out"
    proc = subprocess.run(goodput_command("simulate", "--trace", str(trace), "--policy", "queue-adapter,oracle,static",
                                          "--out", str(out), "--cold-start", "60"),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "queue-adapter" in proc.stdout and "oracle" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    results = {r["policy"]: r for r in data["results"]}
    assert set(results) == {"queue-adapter", "oracle", "static"}
    for r in results.values():
        # Conservation shows in the report too: every request is good, bad, dropped or unfinished.
        assert r["requests"] == 6600
        assert r["dropped"] == 0 and r["unfinished"] == 0
    assert results["oracle"]["vs_oracle"] == 1.0
    assert results["oracle"]["attainment"] >= 0.99  # the oracle search stops at the first plan that reaches it
    # The static fleet never changes: its mean size is exactly the N the bisection settled on.
    static = results["static"]
    assert static["attainment"] >= 0.99 and static["scale_events"] == 0
    assert static["note"] == f"{static['peak_replicas']} replicas" and static["mean_replicas"] == static["peak_replicas"]
    assert (out / "timeline.png").stat().st_size > 10_000


def test_simulate_replays_a_mooncake_jsonl_and_says_what_a_bad_line_is(tmp_path):
    # Mooncake's format (timestamp in ms, input_length, output_length, hash_ids): 1 req/s for
    # 4 minutes; every request is replayed, none dropped, whatever the policy.
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 240_000, 240))
    lines = [json.dumps({"timestamp": int(ms), "input_length": int(rng.integers(500, 4000)),
                         "output_length": int(rng.integers(5, 60)), "hash_ids": [1, 2]}) for ms in t]
    trace = tmp_path / "conversation.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.json"
    proc = subprocess.run(goodput_command("simulate", "--trace", str(trace), "--policy", "goodput,static",
                                          "--json", str(out), "--cold-start", "60"),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "conversation" in proc.stdout
    results = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"goodput", "static"}
    for r in results.values():
        assert r["requests"] == 240 and r["dropped"] == 0 and r["unfinished"] == 0
    # A broken record is a one-line usage error naming the file and line, not a traceback.
    trace.write_text(lines[0] + "\n" + '{"timestamp": 5, "input_length": 10}\n')
    proc = subprocess.run(goodput_command("simulate", "--trace", str(trace), "--policy", "static"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "conversation.jsonl:2" in proc.stderr and "output_length" in proc.stderr


def test_a_target_no_fleet_within_the_maximum_reaches_is_said_under_the_table(tmp_path):
    # 20 req/s of up to 3,000-token prompts on at most one replica: neither search can reach 99 %,
    # and the table's rows for them are their best misses, which the output says.
    trace = tmp_path / "trace.csv"
    _write_azure_csv(trace, seconds=420)
    proc = subprocess.run(goodput_command("simulate", "--trace", str(trace), "--policy", "oracle,static",
                                          "--max-replicas", "1", "--cold-start", "60"),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "note: no oracle plan within --max-replicas 1 reaches the target (99.00 %)" in proc.stdout
    assert "note: no static plan within --max-replicas 1" in proc.stdout
    # Where the target is reached, nothing is said.
    ok = subprocess.run(goodput_command("simulate", "--trace", str(trace), "--policy", "static", "--cold-start", "60"),
                        capture_output=True, text=True, timeout=240)
    assert ok.returncode == 0 and "note: no" not in ok.stdout


def test_unknown_policy_is_a_one_line_usage_error(tmp_path):
    trace = tmp_path / "trace.csv"
    _write_azure_csv(trace, seconds=310)
    proc = subprocess.run(goodput_command("simulate", "--trace", str(trace), "--policy", "hpa-magic"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "hpa-magic" in proc.stderr and "queue-adapter" in proc.stderr


def test_oracle_needs_work_over_window_plus_ttft_and_orders_one_cold_start_ahead():
    # 10 replica-seconds of work arrive in second 100 and nothing else. With a 2 s TTFT, the
    # 1-second window needs 10 / (1 + 2) = 3.33 replicas during the seconds that window covers
    # (only second 100); wider windows need less (10 / (w + 2)).
    work = np.zeros(200)
    work[100] = 10.0
    req = required_replicas(work, ttft_s=2.0, windows_s=(1, 5))
    assert req[100] == 10.0 / 3.0
    assert req[99] == 10.0 / 7.0 and req[104] == 10.0 / 7.0 and req[105] == 0.0
    # Plan: ceil(3.33) = 4 at second 100, so 4 must be ordered from 100 - 30 = 70 with a 30 s
    # cold start (the largest requirement over [t, t + 30]), and released right after.
    plan = oracle_plan(req, cold_start_s=30.0, min_replicas=1, max_replicas=10)
    assert plan[69] == 2 and plan[70] == 4 and plan[100] == 4 and plan[101] == 2 and plan[105] == 1


def test_an_ample_fleet_serves_exactly_the_requests_a_replica_of_their_own_would():
    # Prompts up to 60k tokens at the h100-70b profile's 20k tok/s: some cannot meet the 2 s TTFT
    # even alone. A fleet of 40 replicas at 0.3 req/s is idle whenever a request arrives, so each
    # request is good exactly when servable_alone says so, and that share is below 1.
    from forecaster.simulate.fleet import RequestFleet, servable_alone
    from forecaster.simulate.profiles import load_profile
    from forecaster.simulate.traces import RequestTrace

    rng = np.random.default_rng(11)
    n = 150
    arrival = np.sort(rng.uniform(0, 500, n))
    trace = RequestTrace("long", arrival, rng.integers(100, 60_000, n), rng.integers(1, 200, n))
    profile = load_profile("h100-70b")
    fleet = RequestFleet(profile, trace, 40, 0.0, 0.1)
    k = 0
    while not fleet.idle or k * 0.1 <= arrival[-1]:
        fleet.step(round(k * 0.1, 9))
        k += 1
    alone = servable_alone(profile, trace, 0.1)
    assert 0.5 < alone.mean() < 0.95
    assert np.array_equal(fleet.good, alone)


def test_the_random_router_splits_at_random_where_least_outstanding_balances():
    # 400 short requests, one every 0.1 s, over 4 replicas: each is done before the next comes, so
    # least-outstanding finds ties and hands them to the first replica with the least in flight
    # (replicas 3 and 4 get none), while the random router (a Kubernetes Service) spreads them
    # like a multinomial draw: about 100 each.
    from forecaster.simulate.fleet import RequestFleet
    from forecaster.simulate.profiles import load_profile
    from forecaster.simulate.traces import RequestTrace

    profile = load_profile("h100-70b")
    arrival = np.arange(400) * 0.1
    trace = RequestTrace("even", arrival, np.full(400, 100), np.full(400, 1))
    counts = {}

    class Counted(deque):
        appended = 0

        def append(self, item):
            self.appended += 1
            super().append(item)

    for router in ("least-outstanding", "random"):
        fleet = RequestFleet(profile, trace, 4, 0.0, 0.1, router=router, seed=3)
        for r in fleet.replicas:
            r.waiting = Counted()
        k = 0
        while not fleet.idle or k * 0.1 <= arrival[-1]:
            fleet.step(round(k * 0.1, 9))
            k += 1
        counts[router] = np.array([r.waiting.appended for r in fleet.replicas])
        assert fleet.good.all()
    assert counts["least-outstanding"].sum() == 400 and counts["least-outstanding"][2:].sum() == 0
    assert counts["random"].sum() == 400 and 60 < counts["random"].min() and counts["random"].max() < 140
    with pytest.raises(ValueError, match="router"):
        RequestFleet(profile, trace, 1, 0.0, 0.1, router="round-robin")
    # The command line offers the fleet's routers, default first.
    from forecaster.simulate import cli, fleet as fleet_module
    assert cli.ROUTERS == fleet_module.ROUTERS
