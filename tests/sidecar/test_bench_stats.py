"""The sidecar benchmark's statistics: schedules, paired differences, intervals, verdicts."""

import statistics

from sidecar.bench.arms import CorePlan
from sidecar.bench.client import poisson_schedule
from sidecar.bench.report import Run, summarise
from sidecar.bench.run import SCENARIOS
from sidecar.bench.stats import bootstrap_quantile, gap_quantile_difference, paired_differences


def test_schedule_is_seeded_and_has_the_rate():
    a, b = poisson_schedule(100, 60, seed=3), poisson_schedule(100, 60, seed=3)
    assert a == b                          # every arm sees the same arrivals
    assert a != poisson_schedule(100, 60, seed=4)
    # 6,000 expected arrivals; a Poisson count's sd is sqrt(6000) ~ 77, so 4 sd is 310.
    assert abs(len(a) - 6000) < 310
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert abs(statistics.fmean(gaps) - 0.01) < 0.0005   # exponential gaps of mean 1/rate


def test_little_law_rates():
    # 32 tokens at 20 ms after a 20 ms first token: a stream lasts 0.64 s, so 16 streams need 25/s.
    assert abs(SCENARIOS["paced16"].rate - 25.0) < 1e-9
    assert abs(SCENARIOS["paced64"].rate - 100.0) < 1e-9
    # One-token requests come at a rate of their own (a stream of one token lasts only its TTFT).
    assert SCENARIOS["requests"].rate == SCENARIOS["requests2k"].rate == 50.0


def test_paired_differences_match_by_request_index():
    assert paired_differences({0: 1.0, 1: 2.5, 3: 9.0}, {0: 0.5, 1: 2.0, 2: 7.0}) == [0.5, 0.5]


def test_bootstrap_interval_brackets_the_median():
    values = list(range(1001))           # median 500
    lo, hi = bootstrap_quantile(values, 0.5, resamples=500)
    assert lo < 500 < hi and hi - lo < 120
    assert bootstrap_quantile([1.0], 0.5) is None


def test_gap_difference_of_a_constant_shift():
    direct = [[0.02] * 10 for _ in range(20)]
    arm = [[0.0203] * 10 for _ in range(20)]
    point, ci = gap_quantile_difference(arm, direct, 0.5, resamples=50)
    assert abs(point - 0.0003) < 1e-12 and abs(ci[0] - 0.0003) < 1e-12 and abs(ci[1] - 0.0003) < 1e-12


def _run(arm, repeat, ttfts, cpu=0.0):
    records = [[i, t, 0.02, 0.02] for i, t in enumerate(ttfts)]
    return Run(scenario="paced16", arm=arm, repeat=repeat, records=records, scheduled=len(records), errors=0,
               unfinished=0, tokens=3 * len(records), elapsed=1.0, cpu_arm=cpu)


def test_summary_added_ttft_is_per_request_and_cpu_ratio_is_against_the_relay():
    direct = [0.020 + 0.001 * (i % 7) for i in range(200)]
    runs = [_run("direct", 0, direct), _run("relay", 0, [t + 0.0001 for t in direct], cpu=0.006),
            _run("sidecar", 0, [t + 0.0002 for t in direct], cpu=0.009)]
    doc = summarise(runs, {}, {}, {}, CorePlan((0,), (1,)).describe())
    side = doc["results"]["paced16"]["sidecar"]
    # Every request is exactly 0.2 ms slower, whatever the direct TTFT was: p50 = p99 = 0.2 ms.
    assert abs(side["added_ttft_p50_ms"] - 0.2) < 1e-9 and abs(side["added_ttft_p99_ms"] - 0.2) < 1e-9
    # 9 ms over 600 tokens = 15 µs/token, against the relay's 10: 1.5x.
    assert abs(side["cpu_us_per_token"] - 15.0) < 1e-9 and abs(side["cpu_per_token_vs_relay"] - 1.5) < 1e-9
    assert doc["targets"]["paced16: sidecar added TTFT p50 ms"]["met"] is True
    # Every request 0.2 ms slower: the interval is [0.2, 0.2], wholly under 0.3 ms.
    assert doc["targets"]["paced16: sidecar added TTFT p50 ms"]["settled"] is True
    assert doc["targets"]["paced16: sidecar CPU per token / relay's"]["met"] is False


def test_the_direct_path_run_again_is_the_methods_floor_beside_each_latency_target():
    from sidecar.bench.report import verdict

    direct = [0.020 + 0.001 * (i % 7) for i in range(200)]
    # The second direct run of the same schedule: every request 1.5 ms later (say, timer jitter), once in 100.
    again = [t + (0.0015 if i % 100 == 0 else 0.0) for i, t in enumerate(direct)]
    runs = [_run("direct", 0, direct), _run("direct-again", 0, again),
            _run("sidecar", 0, [t + 0.0002 for t in direct], cpu=0.009)]
    doc = summarise(runs, {}, {}, {}, CorePlan((0,), (1,)).describe())
    a = doc["results"]["paced16"]["direct-again"]
    assert a["cpu_us_per_request"] is None and a["cpu_us_per_token"] is None   # no process of its own
    assert a["added_ttft_p50_ms"] == 0.0 and a["added_ttft_p99_ms"] > 0.0
    p99 = doc["targets"]["paced16: sidecar added TTFT p99 ms"]
    assert p99["floor"]["value"] == a["added_ttft_p99_ms"]
    assert "the method's floor, direct against direct: " in verdict(p99)
    # Without the control arm, no floor is claimed.
    doc = summarise([runs[0], runs[2]], {}, {}, {}, CorePlan((0,), (1,)).describe())
    assert "floor" not in doc["targets"]["paced16: sidecar added TTFT p99 ms"]


def test_a_target_whose_interval_reaches_across_it_is_not_settled():
    from sidecar.bench.report import _check, verdict

    # The fourth run of 2026-12-05: paced16 0.286 [0.23, 0.35] against < 0.3.
    straddles = _check(0.286, 0.3, "<", (0.23, 0.35))
    assert straddles["met"] is True and straddles["settled"] is False
    assert verdict(straddles).startswith("met (its 95 % interval [0.230, 0.350] reaches across")
    missed = _check(0.324, 0.3, "<", (0.29, 0.36))
    assert missed["met"] is False and missed["settled"] is False
    clear = _check(1.96, 1.0, "<", (1.82, 2.29))
    assert clear["met"] is False and clear["settled"] is True and verdict(clear) == "NOT met"
    assert "settled" not in _check(0.5, 1.0, "<")          # no interval: the point verdict only


def test_litellm_that_cannot_install_is_missing_with_the_reason(tmp_path, monkeypatch):
    import subprocess
    import sys

    from sidecar.bench import litellm_arm

    venv = tmp_path / "litellm-venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)     # an existing venv: no venv creation
    monkeypatch.setenv("GOODPUT_CACHE", str(tmp_path))
    monkeypatch.setattr(litellm_arm, "_pip", lambda python, *args, **kw: subprocess.CompletedProcess(
        args, 1, "", "ERROR: No matching distribution found for litellm==1.110.2"))
    try:
        litellm_arm.start("http://127.0.0.1:9", (), "sk-test", progress=lambda line: None)
    except litellm_arm.Unavailable as exc:
        assert "No matching distribution found" in str(exc)
    else:
        raise AssertionError("expected Unavailable")
    assert not (tmp_path / "litellm-venv" / ".goodput-installed").exists()   # retried on the next run


def test_settle_restarts_an_arm_that_fell_behind_and_waits_for_the_upstream_to_empty():
    # A saturated proxy keeps sending its backlog to the shared upstream after its client gave up;
    # the next run must not start until the arm is restarted and the upstream has nothing in flight.
    import json
    import sys
    import threading
    import time
    import urllib.request

    from sidecar.bench.arms import Proc, Stack, free_port

    def scripted(port):
        return Proc(f"scripted {port}", [sys.executable, "-m", "sidecar.bench.scripted_upstream", "--port", str(port)],
                    f"http://127.0.0.1:{port}/health")

    up_port, arm_port = free_port(), free_port()
    upstream, arm = scripted(up_port), scripted(arm_port)
    url = f"http://127.0.0.1:{up_port}"
    stack = Stack(upstream, {"direct": url, "arm": f"http://127.0.0.1:{arm_port}"}, {"direct": None, "arm": arm}, {})
    try:
        body = json.dumps({"model": "scripted", "stream": True, "max_tokens": 8,
                           "script": {"ttft": 0.3, "itl": 0.1}}).encode()   # about 1 s in flight
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        done = []
        worker = threading.Thread(target=lambda: done.append(urllib.request.urlopen(request, timeout=10).read()))
        worker.start()
        time.sleep(0.2)
        pid = arm.proc.pid
        stack.settle("arm", saturated=True)
        # Restarted on the same port, and the upstream's request had ended before settle returned.
        assert arm.proc.pid != pid and arm.proc.poll() is None
        urllib.request.urlopen(f"http://127.0.0.1:{arm_port}/health", timeout=2).close()
        with urllib.request.urlopen(url + "/stats", timeout=2) as resp:
            assert json.loads(resp.read())["active"] == 0
        worker.join(5)
        assert done and b"[DONE]" in done[0]
        stack.settle("arm", saturated=False)
        assert arm.proc.poll() is None
    finally:
        stack.stop()


def test_settle_restarts_an_upstream_that_does_not_empty_and_a_failed_restart_raises():
    # An upstream still busy after the wait (after LiteLLM's restart it once stayed so for
    # minutes, and the next arm's restart then timed out on it) is restarted on its own port.
    import json
    import sys
    import threading
    import time
    import urllib.request

    import pytest

    from sidecar.bench.arms import Proc, Stack, free_port

    port = free_port()
    upstream = Proc("scripted", [sys.executable, "-m", "sidecar.bench.scripted_upstream", "--port", str(port)],
                    f"http://127.0.0.1:{port}/health")
    url = f"http://127.0.0.1:{port}"
    stack = Stack(upstream, {"direct": url}, {"direct": None}, {})
    try:
        body = json.dumps({"model": "scripted", "stream": True, "max_tokens": 200,
                           "script": {"ttft": 0.1, "itl": 0.1}}).encode()   # 20 s in flight
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        cut = []

        def read():
            try:
                urllib.request.urlopen(request, timeout=30).read()
            except Exception as exc:   # noqa: BLE001 - the restart cuts the stream; which error is http.client's
                cut.append(exc)

        worker = threading.Thread(target=read, daemon=True)
        worker.start()
        for _ in range(100):
            with urllib.request.urlopen(url + "/stats", timeout=2) as resp:
                if json.loads(resp.read())["active"] >= 1:
                    break
            time.sleep(0.05)
        pid = upstream.proc.pid
        stack.settle("direct", saturated=False, timeout=0.5)
        assert upstream.proc.pid != pid and upstream.proc.poll() is None
        with urllib.request.urlopen(url + "/stats", timeout=2) as resp:
            assert json.loads(resp.read())["active"] == 0
        worker.join(5)
        assert cut    # the request in flight went with the old process
        # A process that will not come back says so, for the benchmark to go on without it.
        upstream.argv, upstream.timeout = [sys.executable, "-c", "import time; time.sleep(30)"], 1.0
        with pytest.raises(TimeoutError, match="did not answer"):
            upstream.restart()
        assert upstream.proc.poll() is not None
    finally:
        stack.stop()


def test_an_arm_that_writes_much_to_stderr_keeps_running():
    # stderr once went to a pipe nobody read: the scripted upstream's tracebacks filled it and its
    # event loop blocked in the write. A process that writes 300 KB there must still answer.
    import sys

    from sidecar.bench.arms import Proc, free_port

    port = free_port()
    code = ("import sys, http.server\n"
            "sys.stderr.write('x' * 300000 + 'the end'); sys.stderr.flush()\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers()\n"
            "    def log_message(self, *a):\n"
            "        sys.stderr.write('logged ' * 2000)\n"
            f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    proc = Proc("chatty", [sys.executable, "-c", code], f"http://127.0.0.1:{port}/health", timeout=10)
    try:
        assert proc.proc.poll() is None
        assert proc.server.log().endswith("logged ")    # kept, to read when something goes wrong
    finally:
        proc.stop()


def test_the_otlp_arm_exports_every_span_to_the_benchmarks_receiver():
    # The sidecar-otlp arm measures what exporting costs only if its spans really leave: the
    # receiver counts the spans it parsed, and a stopped sidecar flushes the ones still queued.
    import json
    import time
    import urllib.request

    from sidecar.bench.arms import start_stack

    stack = start_stack(0.01, 0.005, CorePlan(load=(), arm=()), ("direct", "sidecar-otlp"), None, "")
    try:
        body = json.dumps({"model": "scripted", "stream": True, "max_tokens": 4}).encode()
        for _ in range(5):
            request = urllib.request.Request(stack.urls["sidecar-otlp"] + "/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert b"[DONE]" in resp.read()
        stack.procs["sidecar-otlp"].stop()   # SIGTERM: the sidecar flushes what the SDK still batches
        deadline = time.monotonic() + 10
        while (stack.sink_stats() or {}).get("spans", 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = stack.sink_stats()
        assert stats["spans"] == 5 and stats["trace_posts"] >= 1 and stats["unparsed"] == 0, stats
    finally:
        stack.stop()
    assert stack.sink.proc.poll() is not None    # stopped with the stack, its last count kept
    assert stack.exported["spans"] == 5


def test_the_prompt_scenario_sends_prompts_of_the_size_it_names():
    import json

    from sidecar.bench.client import request_bodies
    from sidecar.bench.run import _client_argv

    (one,) = request_bodies(1, 0)
    assert json.loads(one)["messages"] == [{"role": "user", "content": "benchmark"}]
    bodies = request_bodies(1, 2048)
    assert bodies == request_bodies(1, 2048)       # every arm and repeat sends the same bytes
    docs = [json.loads(b) for b in bodies]
    systems = {d["messages"][0]["content"] for d in docs}
    users = [d["messages"][1]["content"] for d in docs]
    assert len(systems) == 1 and len(set(users)) == len(users)   # one shared system prompt, own user parts
    chars = len(next(iter(systems))) + sum(map(len, users)) / len(users)
    # 4 characters a token, in whole lines (the longest: 12 of indent, 10 words of up to 7 and 9 spaces).
    assert 4 * 2048 <= chars <= 4 * 2048 + 2 * 91
    sc = SCENARIOS["requests2k"]
    argv = _client_argv("http://x", sc, 1.0, seed=1)
    assert argv[argv.index("--prompt-tokens") + 1] == "2048" and argv[argv.index("--rate") + 1] == "50"
    assert argv[argv.index("--tokens") + 1] == "1"


def test_both_one_token_scenarios_are_judged_per_request():
    runs = []
    for name in ("requests", "requests2k"):
        for arm, cpu in (("direct", 0.0), ("relay", 0.013), ("sidecar", 0.05)):
            records = [[i, 0.02] for i in range(100)]
            runs.append(Run(scenario=name, arm=arm, repeat=0, records=records, scheduled=100, errors=0,
                            unfinished=0, tokens=100, elapsed=1.0, cpu_arm=cpu))
    from dataclasses import asdict

    described = {name: asdict(SCENARIOS[name]) for name in ("requests", "requests2k")}
    doc = summarise(runs, described, {}, {}, CorePlan((0,), (1,)).describe())
    for name in ("requests", "requests2k"):
        check = doc["targets"][f"{name}: sidecar CPU per request µs"]
        assert abs(check["value"] - 500.0) < 1e-9 and check["met"] is False     # 50 ms over 100 requests
        assert f"{name}: sidecar CPU per token / relay's" not in doc["targets"]
