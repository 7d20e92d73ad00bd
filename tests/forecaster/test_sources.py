"""Sources: direct scraping (resets, failures), EndpointSlice discovery, a real Prometheus."""

import json
import shutil
import subprocess
import tempfile
import threading
import time

import pytest
from kubernetes import client as k8s

from forecaster.sources.kube import EndpointSliceDiscovery
from forecaster.sources.prometheus import PrometheusSource
from forecaster.sources.scrape import ScrapeSource, static_targets
from tests.forecaster.sidecar_metrics import FakeSidecarMetrics
from tests.support import GetServer, free_port


@pytest.fixture
def sidecars():
    made = []

    def make():
        s = FakeSidecarMetrics(free_port())
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def test_scrape_sums_sidecars_and_survives_a_counter_reset(sidecars):
    a, b = sidecars(), sidecars()
    src = ScrapeSource(static_targets([a.url, b.url]))
    a.serve(good=10, waiting=2, kv=0.5)
    b.serve(good=5, violated=1, waiting=3, kv=0.3)
    first = src.poll(now=100.0)
    assert first.arrivals_total == 0.0  # first scrape of each target: nothing to difference yet
    assert (first.queue_waiting, first.ready_replicas) == (5.0, 2)
    assert first.kv_cache_usage == pytest.approx(0.4)
    a.serve(good=4)
    b.serve(good=2, violated=2)
    second = src.poll(now=115.0)
    assert (second.arrivals_total, second.good_total) == (8.0, 6.0)
    # Sidecar b restarts: a fresh registry counts from zero. Its 3 new requests are added,
    # the drop from 10 to 3 is not subtracted.
    b.stop()
    b2 = FakeSidecarMetrics(b.port)
    b2.serve(good=3)
    a.serve(good=1)
    third = src.poll(now=130.0)
    assert third.arrivals_total == 8.0 + 1 + 3
    b2.stop()
    # b gone: a alone is read, the fleet counts one ready replica.
    a.serve(good=2)
    fourth = src.poll(now=145.0)
    assert (fourth.arrivals_total, fourth.ready_replicas) == (14.0, 1)
    assert any("ConnectError" in e for e in src.last_errors.values())
    src.close()


class EndpointSliceAPI:
    """The only stand-in here: no Kubernetes API server runs on these machines, so this answers
    GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices with the list JSON the real API
    server returns (fields as in discovery.k8s.io/v1 EndpointSliceList), and keeps the paths asked."""

    def __init__(self):
        self.body: dict = {}
        self.seen: list[str] = []
        self.server = GetServer(self._answer, content_type="application/json")

    def _answer(self, path: str) -> bytes:
        self.seen.append(path)
        return json.dumps(self.body).encode()

    def client(self):
        cfg = k8s.Configuration()
        cfg.host = f"http://{self.server.address}"
        return k8s.ApiClient(cfg)


def _endpoint(ip, ready, terminating=False):
    return {"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": "serving", "name": f"pod-{ip}"}}


def test_endpointslice_discovery_finds_ready_pods_and_counts_starting_ones():
    api = EndpointSliceAPI()
    api.body = {
        "kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "metadata": {"resourceVersion": "42"},
        "items": [{
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "llm-abc12", "namespace": "serving",
                         "labels": {"kubernetes.io/service-name": "llm"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9100, "protocol": "TCP"}],
            "endpoints": [_endpoint("10.0.0.5", True), _endpoint("10.0.0.6", True), _endpoint("10.0.0.7", False),
                          _endpoint("10.0.0.8", False, terminating=True)],
        }],
    }
    with api.server:
        disc = EndpointSliceDiscovery("serving", "llm", port_name="http", api_client=api.client())
        assert disc.targets() == ["http://10.0.0.5:8080/metrics", "http://10.0.0.6:8080/metrics"]
        # 10.0.0.7 is not ready yet (cold start); 10.0.0.8 is terminating and counts for nothing.
        assert disc.starting() == 1
        assert api.seen[-1] == ("/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
                                "?labelSelector=kubernetes.io/service-name%3Dllm")


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus binary")
def test_prometheus_source_reads_rates_and_warms_up_from_history(sidecars):
    side = sidecars()
    stop = threading.Event()

    def traffic():  # 20 requests/s, 3 waiting, until stopped
        while not stop.is_set():
            side.serve(good=2, waiting=3)
            time.sleep(0.1)

    threading.Thread(target=traffic, daemon=True).start()
    prom_port = free_port()
    workdir = tempfile.mkdtemp(prefix="goodput-prom-")
    with open(f"{workdir}/prometheus.yml", "w") as f:
        f.write(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sidecar\n"
                f"    static_configs:\n      - targets: ['{side.url}']\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={workdir}/prometheus.yml",
                             f"--storage.tsdb.path={workdir}/data", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        src = PrometheusSource(f"http://127.0.0.1:{prom_port}", window="5s", step_seconds=1.0)
        deadline = time.time() + 30
        sample = None
        while time.time() < deadline:
            try:
                sample = src.poll()
            except Exception:  # still starting
                sample = None
            if sample is not None and src.instant("sum(rate(goodput_requests_total[5s]))", time.time()) > 0:
                break
            time.sleep(0.5)
        time.sleep(3)  # a few more scrapes, so rate() covers a full window of traffic
        rate = src.instant(src.queries["arrivals"], time.time())
        assert 14 < rate < 26, rate  # 20/s written; rate() over 1-s scrapes of a 5-s window
        # The totals below are compared with each other, one query each: with traffic still
        # flowing, a scrape landing between two queries made them disagree by a request or so
        # (seen once in CI). Stopped, and two scrapes later, every total holds still.
        stop.set()
        time.sleep(2.5)
        s = src.poll()
        assert s.queue_waiting == 3.0 and s.ready_replicas == 1
        # What the service model learns from: the engines' queue / prefill split (0.05 s and
        # 0.2 s a request), iterations (5 a request, 10 tokens), and the token histograms by
        # bucket (every prompt 100 tokens: the le=64 bucket empty, le=128 holding them all).
        assert s.prefill_sum_total / s.prefill_count_total == pytest.approx(0.2, rel=1e-6)
        assert s.queue_sum_total / s.queue_count_total == pytest.approx(0.05, rel=1e-6)
        assert s.generation_tokens_total / s.engine_steps_total == pytest.approx(2.0, rel=0.05)
        hist = s.input_token_hist_total
        assert hist[64.0] == 0.0 and hist[128.0] > 0 and hist[128.0] == pytest.approx(hist[float("inf")], rel=1e-6)
        out = s.output_token_hist_total
        assert out[8.0] == 0.0 and out[16.0] == pytest.approx(hist[128.0], rel=1e-6)
        # The arrival-clump counters, by window (3, 5 and 9 a request in the fake).
        sq = s.arrivals_squared_total
        assert sq[1.0] / sq[0.1] == pytest.approx(5 / 3, rel=1e-6) and sq[10.0] / sq[0.1] == pytest.approx(3.0, rel=1e-6)
        fresh = PrometheusSource(f"http://127.0.0.1:{prom_port}", window="5s", step_seconds=1.0)
        history = fresh.history(5.0)
        assert history[-1].input_token_hist_total and history[-1].prefill_count_total
        assert set(history[-1].arrivals_squared_total) == {0.1, 1.0, 10.0}
        # A 5-s range at 1-s steps holds 5 or 6 points; totals grow by ~20 per step.
        assert len(history) >= 4
        growth = (history[-1].arrivals_total - history[0].arrivals_total) / (history[-1].t - history[0].t)
        assert 14 < growth < 26, growth
        with pytest.raises(Exception, match="bad_data"):
            src.instant("sum(rate(", time.time())
    finally:
        stop.set()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_arrivals_are_counted_when_requests_arrive_not_when_they_end():
    from forecaster.sources.scrape import parse_metrics
    # 7 requests ended, 12 arrived (5 still being served): demand is the 12.
    text = ('# TYPE goodput_requests_total counter\n'
            'goodput_requests_total{model="m",slo_class="default",outcome="good"} 7\n'
            '# TYPE goodput_requests_arrived_total counter\n'
            'goodput_requests_arrived_total{model="m",slo_class="default"} 9\n'
            'goodput_requests_arrived_total{model="m",slo_class="batch"} 3\n')
    got = parse_metrics(text)
    assert (got["arrivals"], got["good"]) == (12.0, 7.0)
    # A sidecar older than the arrival counter: fall back to the requests it ended.
    older = parse_metrics(text.split("# TYPE goodput_requests_arrived_total")[0])
    assert older["arrivals"] == 7.0


def test_endpointslice_discovery_learns_the_cold_start():
    def body(ready):
        return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "metadata": {"resourceVersion": "1"},
                "items": [{"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                           "metadata": {"name": "llm-x", "namespace": "serving",
                                        "labels": {"kubernetes.io/service-name": "llm"}},
                           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                           "endpoints": [_endpoint("10.0.0.5", True), _endpoint("10.0.0.9", ready)]}]}
    api = EndpointSliceAPI()
    with api.server:
        disc = EndpointSliceDiscovery("serving", "llm", port_name="http", api_client=api.client())
        clock = [1000.0]
        disc._clock = lambda: clock[0]
        api.body = body(False)
        disc.refresh()
        assert disc.starting() == 1 and disc.cold_start_seconds() is None
        clock[0] += 95.0          # still starting at the next refreshes
        disc.refresh()
        clock[0] += 30.0
        api.body = body(True)
        disc.refresh()
        # First seen not ready at 1000, ready at 1125: a 125 s cold start (10.0.0.5 was ready when
        # first seen, so it teaches nothing).
        assert disc.cold_start_seconds() == 125.0 and list(disc.cold_starts) == [125.0]
        src = ScrapeSource(static_targets([]), cold_start=disc.cold_start_seconds)
        assert src.cold_start_seconds() == 125.0


def test_shed_requests_are_demand_in_what_the_real_sidecar_exposes():
    # The sidecar's own metrics: 5 requests served good, 3 refused by the admission guard (shed,
    # never started). The forecaster must see 8 arrivals (3 of them shed) and 5 good.
    from prometheus_client import CollectorRegistry, generate_latest

    from forecaster.sources.scrape import parse_metrics
    from sidecar.config import DEFAULT_SLO_CONFIG
    from sidecar.metrics import SidecarMetrics
    from sidecar.slo import Verdict
    from sidecar.timing import RequestTiming

    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, DEFAULT_SLO_CONFIG)
    slo = DEFAULT_SLO_CONFIG.classes["interactive"]
    served = RequestTiming(ttft=0.1, e2e=0.5, itl=[], tpot=0.05, output_tokens=9, input_tokens=20, finish_reasons=[],
                           error=None, usage_seen=True, model="m")
    refused = RequestTiming(ttft=None, e2e=0.001, itl=[], tpot=None, output_tokens=0, input_tokens=None, finish_reasons=[],
                            error=None, usage_seen=False, model=None)
    for _ in range(5):
        metrics.arrived_now("m", slo.name)
        metrics.started("m", slo.name)
        metrics.finished("m", slo, served, Verdict("good"))
    for _ in range(3):
        metrics.arrived_now("m", slo.name)
        metrics.finished("m", slo, refused, Verdict("shed"), in_flight=False)
    got = parse_metrics(generate_latest(registry).decode())
    assert (got["arrivals"], got["good"]) == (8.0, 5.0)
    # The older fallback (requests by outcome, counted at the end) includes them too.
    older = parse_metrics("\n".join(line for line in generate_latest(registry).decode().splitlines()
                                     if "arrived" not in line) + "\n")
    assert older["arrivals"] == 8.0
    # A shed request has no latency: nothing was added to the TTFT or E2E histograms for it.
    assert registry.get_sample_value("goodput_e2e_seconds_count", {"model": "m", "slo_class": "interactive"}) == 5


def test_the_real_sidecar_counts_arrival_clumps_per_window_and_the_scrape_reads_them():
    # Arrivals at 0.01, 0.04, 0.06, 0.25 and 1.50 s (the sidecar's clock): in 0.1-s windows 3, 1
    # and 1 (Σn² = 11), in 1-s windows 4 and 1 (17), in 10-s windows 5 (25). The scrape source
    # reads one counter per window and differences them per target, as every other counter.
    from prometheus_client import CollectorRegistry, generate_latest

    from forecaster.prompt_queue import ARRIVAL_WINDOWS_S
    from forecaster.sources.scrape import parse_metrics
    from sidecar.config import DEFAULT_SLO_CONFIG
    from sidecar.metrics import ARRIVAL_WINDOWS, SidecarMetrics

    assert tuple(w for _, w in ARRIVAL_WINDOWS) == ARRIVAL_WINDOWS_S
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, DEFAULT_SLO_CONFIG)
    now = [100.0]
    metrics.clock = lambda: now[0]
    for t in (100.01, 100.04, 100.06, 100.25, 101.5):
        now[0] = t
        metrics.arrived_now("m", "interactive")
    squares = {w: registry.get_sample_value("goodput_requests_arrived_squared_total", {"model": "m", "window_seconds": w})
               for w in ("0.1", "1", "10")}
    assert squares == {"0.1": 11.0, "1": 17.0, "10": 25.0}
    got = parse_metrics(generate_latest(registry).decode())
    assert (got["arrsq:0.1"], got["arrsq:1.0"], got["arrsq:10.0"], got["arrivals"]) == (11.0, 17.0, 25.0, 5.0)
    pages = [generate_latest(registry).decode()]
    src = ScrapeSource(static_targets(["sidecar:8080"]), fetch=lambda url: pages[-1])
    assert src.poll(now=0.0).arrivals_squared_total is None      # first scrape: nothing to difference
    now[0] = 101.6
    metrics.arrived_now("m", "interactive")                      # the 2nd in its 1-s window: +3
    pages.append(generate_latest(registry).decode())
    assert src.poll(now=15.0).arrivals_squared_total == {0.1: 1.0, 1.0: 3.0, 10.0: 11.0}
    src.close()


def test_the_decode_batch_reaches_the_first_step_that_has_requests_ending():
    # The sidecar creates its decode-batch counters at 0 with a model's first request; the scrape
    # source reports them from 0 from then on, so the step in which the first requests end has
    # their batch too (differenced against None, it had none, and the learner fell back to the
    # running gauge for that step: on the live step test, a point far off the engine's step).
    from prometheus_client import CollectorRegistry, generate_latest

    from forecaster.fleet_sample import step_observation
    from sidecar.config import DEFAULT_SLO_CONFIG
    from sidecar.metrics import SidecarMetrics
    from sidecar.slo import Verdict
    from sidecar.timing import RequestTiming

    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, DEFAULT_SLO_CONFIG)
    slo = DEFAULT_SLO_CONFIG.classes["interactive"]
    pages = []
    src = ScrapeSource(static_targets(["sidecar:8080"]), fetch=lambda url: pages[-1])
    metrics.arrived_now("m", slo.name)
    metrics.started("m", slo.name)
    mark = metrics.decoding.began(10.0)             # its first chunk went by at 10 s
    pages.append(generate_latest(registry).decode())
    first = src.poll(now=0.0)
    assert (first.decode_batch_total, first.decode_batch_count_total) == (0.0, 0.0)
    other = metrics.decoding.began(11.0)            # another decodes beside it from 11 s ...
    done = RequestTiming(ttft=0.1, e2e=2.1, itl=[], tpot=0.2, output_tokens=11, input_tokens=2, finish_reasons=[],
                         error=None, usage_seen=True, model="m", first_token_at=10.0, decode_mark=mark)
    metrics.finished("m", slo, done, Verdict("good"))    # ... until it ends at 12 s: mean batch 1.5
    pages.append(generate_latest(registry).decode())
    second = src.poll(now=2.0)
    assert (second.decode_batch_total, second.decode_batch_count_total) == (1.5, 1.0)
    obs = step_observation(first, second, arrival_rps=0.5)
    assert (obs.decode_batch_sum, obs.decode_batch_count) == (1.5, 1.0)
    assert metrics.decoding.decoding == 1 and other == 1.0
    src.close()
