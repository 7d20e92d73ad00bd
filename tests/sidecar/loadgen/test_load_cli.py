"""`goodput load` and `goodput sweep` end to end against the scripted upstream (known timings)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import free_port, goodput_command

TTFT, ITL = 0.05, 0.01


@pytest.fixture
def upstream(start_server):
    port = free_port()
    start_server([sys.executable, "-m", "sidecar.bench.scripted_upstream", "--port", str(port),
                  "--ttft", str(TTFT), "--itl", str(ITL)], f"http://127.0.0.1:{port}/health", name="scripted")
    return f"http://127.0.0.1:{port}"


def test_load_measures_the_scripted_timings(upstream, tmp_path):
    records = tmp_path / "records.jsonl"
    summary = tmp_path / "summary.json"
    proc = subprocess.run(goodput_command("load", "--url", upstream, "--model", "scripted", "--rate", "20",
                                          "--num-requests", "20", "--output-tokens", "8", "--slo-ttft", "0.5",
                                          "--slo-tpot", "0.05", "--records", str(records), "--json", str(summary),
                                          "--quiet"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(rows) == 20 and all(r["outcome"] == "good" for r in rows)
    for r in rows:
        # The upstream waits TTFT before the first token and ITL between tokens; loopback and the
        # client add well under 15 ms on an idle machine, and never subtract.
        assert TTFT <= r["ttft"] < TTFT + 0.015
        assert r["output_tokens"] == 8 and len(r["itl"]) == 7
        assert ITL * 0.9 <= r["tpot"] < ITL + 0.006
    doc = json.loads(summary.read_text())
    assert doc["requests"] == 20 and doc["good"] == 20 and doc["attainment"] == 1.0
    assert "goodput" in proc.stdout


def test_sweep_writes_a_report_with_a_knee(upstream, tmp_path):
    out = tmp_path / "report"
    # TTFT objective 30 ms is below the upstream's 50 ms: every request violates it, no knee.
    proc = subprocess.run(goodput_command("sweep", "--url", upstream, "--model", "scripted", "--rates", "5,10",
                                          "--duration", "1", "--output-tokens", "4", "--slo-ttft", "0.03",
                                          "--out", str(out), "--quiet"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "sweep.json").read_text())
    assert [p["rate"] for p in doc["points"]] == [5.0, 10.0]
    assert doc["knee"] is None and all(p["violations"].get("ttft") == p["requests"] for p in doc["points"])
    assert (out / "goodput.png").stat().st_size > 1000 and (out / "latency.png").exists()
    assert "Knee: none" in (out / "summary.md").read_text()


def test_load_refuses_bad_input_in_one_line():
    proc = subprocess.run(goodput_command("load", "--url", "http://127.0.0.1:9", "--model", "m"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["goodput: error: give --rate R (req/s) or --trace FILE"]


def test_sweep_refuses_a_trace_it_would_replay_unchanged_at_every_rate(tmp_path):
    # A trace carries its own arrival times, so "--rates" would be ignored: refuse in one line.
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\n")
    proc = subprocess.run(goodput_command("sweep", "--url", "http://127.0.0.1:9", "--model", "m", "--rates", "1,2",
                                          "--trace", str(trace)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "goodput load --trace" in proc.stderr


def test_ctrl_c_stops_cleanly_and_keeps_what_was_measured(start_server, tmp_path):
    import signal
    import time

    port = free_port()
    # 0.2 s between tokens and 20 tokens: each stream takes ~4 s, so an interrupt at 4 s finds
    # requests mid-stream (cancelled, kept) and most of the 40 not yet sent.
    start_server([sys.executable, "-m", "sidecar.bench.scripted_upstream", "--port", str(port),
                  "--ttft", "0.01", "--itl", "0.2"], f"http://127.0.0.1:{port}/health", name="scripted")
    records = tmp_path / "r.jsonl"
    proc = subprocess.Popen(goodput_command("load", "--url", f"http://127.0.0.1:{port}", "--model", "scripted",
                                            "--rate", "2", "--num-requests", "40", "--output-tokens", "20",
                                            "--records", str(records), "--quiet"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    # Poisson at 2 req/s for 4 s: some requests went out (kept and summarised); 40 would take 20 s,
    # so the interrupt must have stopped the rest from being sent.
    assert 0 < len(rows) < 40
    assert any(r["outcome"] == "cancelled" for r in rows)
    assert all(r["outcome"] in ("good", "slo_violated", "cancelled") for r in rows)
    assert "cancelled" in out
