"""`goodput forecaster run`: sources → policy → /metrics and the External Metrics API."""

from __future__ import annotations

import argparse
import atexit
import logging
import shutil
import signal
import threading
from pathlib import Path

from goodput_cli.errors import UsageError


def _prior(args) -> dict:
    """--prior FILE: a `goodput bench engine --json` result seeds the service model's fit; a
    `goodput sweep` report (sweep.json or its folder) the capacity used until the model is known."""
    if not args.prior:
        return {}
    import json
    from pathlib import Path

    from forecaster.capacity import load_sweep_capacity
    from forecaster.service_prior import decode_points, model_from_bench

    path = Path(args.prior)
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--prior {path}: not readable JSON ({exc})") from None
    try:
        if isinstance(data, dict) and "engine_decode" in data:
            out = {"prior_model": model_from_bench(data),
                   "prior_batches": tuple(b for b, _ in decode_points(data))}
            if "prior_weight_requests" in data:
                weight = data["prior_weight_requests"]
                if not (isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight > 0):
                    raise ValueError(f"prior_weight_requests must be a number > 0, got {weight!r}")
                out["prior_weight"] = float(weight)
            return out
        return {"prior_capacity_rps": load_sweep_capacity(path)}
    except ValueError as exc:
        raise UsageError(f"--prior {path}: {exc}; pass a `goodput bench engine --json` result or a "
                         f"`goodput sweep` sweep.json") from None


def policy_config(args, background_selection: bool):
    """The policy the policy flags describe (`forecaster run` and `forecaster replay` share them)."""
    from forecaster.policy import PolicyConfig

    try:
        return PolicyConfig(step_seconds=args.step, horizon_seconds=args.horizon,
                            cold_start_seconds=args.cold_start if args.cold_start is not None else args.horizon,
                            learn_cold_start=args.cold_start is None,
                            capacity_rps=_capacity(args), target_queue=args.target_queue,
                            min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                            scale_down_window_seconds=args.scale_down_window, fit_timeout_seconds=args.fit_timeout,
                            refit_every_seconds=args.refit_every,
                            models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
                            background_selection=background_selection, **_prior(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _capacity(args) -> float | None:
    from forecaster.capacity import load_sweep_capacity

    if args.capacity is not None and args.capacity_from:
        raise UsageError("give --capacity or --capacity-from, not both")
    if args.capacity_from:
        try:
            return load_sweep_capacity(args.capacity_from)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return args.capacity


def _source(args):
    chosen = [bool(args.prometheus), bool(args.targets), bool(args.kube_service)]
    if sum(chosen) != 1:
        raise UsageError("choose one source: --prometheus URL, --targets HOST:PORT,... or --kube-service NAME")
    if args.prometheus:
        from forecaster.sources.prometheus import PrometheusSource
        queries = {}
        for item in args.query or []:
            name, sep, promql = item.partition("=")
            if not sep:
                raise UsageError(f"--query takes NAME=PROMQL, got {item!r}")
            queries[name.strip()] = promql
        try:
            return PrometheusSource(args.prometheus, queries, window=args.rate_window, step_seconds=args.step)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    from forecaster.sources.scrape import ScrapeSource, static_targets
    if args.targets:
        return ScrapeSource(static_targets([t.strip() for t in args.targets.split(",") if t.strip()]))
    from forecaster.sources.kube import EndpointSliceDiscovery
    from kubernetes import client as k8s

    api_client = None
    if args.kube_api:
        # An explicit API URL (plain HTTP, e.g. `kubectl proxy`) instead of kubeconfig/in-cluster.
        cfg = k8s.Configuration()
        cfg.host = args.kube_api
        api_client = k8s.ApiClient(cfg)
    disc = EndpointSliceDiscovery(args.kube_namespace, args.kube_service, port_name=args.kube_port_name,
                                  api_client=api_client, refresh_seconds=args.step)
    return ScrapeSource(disc.targets, starting=disc.starting, cold_start=disc.cold_start_seconds)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from forecaster.policy import ForecastPolicy
    from forecaster.replay import Recorder
    from forecaster.runner import Runner
    from forecaster.server import ExternalMetricsAPI, ForecastCollector, ForecastState, api_routes, metrics_routes, start_server
    from forecaster.tls import self_signed, server_context

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape would bury the decisions
    config = policy_config(args, background_selection=True)
    try:
        policy = ForecastPolicy(config)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ssl_ctx = None
    cert = key = None
    grpc_tls = bool(args.keda_grpc_port) and not args.keda_grpc_plaintext
    if args.api_port or grpc_tls:
        if args.self_signed:
            cert, key = self_signed(args.tls_dir, hosts=tuple(args.tls_host or ("localhost", "127.0.0.1")))
            if not args.tls_dir:   # a temporary directory holding a private key: gone at exit, whatever the path
                atexit.register(shutil.rmtree, cert.parent, True)
            logging.info("self-signed certificate for development: %s (key %s)", cert, key)
        elif args.tls_cert_file and args.tls_private_key_file:
            cert, key = args.tls_cert_file, args.tls_private_key_file
        elif args.api_port:
            raise UsageError("the External Metrics API needs --tls-cert-file and --tls-private-key-file "
                             "(or --self-signed for development, or --api-port 0 to turn it off)")
        else:
            raise UsageError("the KEDA external scaler (--keda-grpc-port) serves TLS with --tls-cert-file and "
                             "--tls-private-key-file (or --self-signed for development, or --keda-grpc-plaintext)")
        try:
            ssl_ctx = server_context(cert, key, args.tls_client_ca_file)
        except (ValueError, OSError) as exc:
            raise UsageError(str(exc)) from None
        if not args.api_port:
            ssl_ctx = None
    source = _source(args)
    state = ForecastState(config.horizon_seconds)
    registry = CollectorRegistry()
    registry.register(ForecastCollector(state))
    servers = [start_server(metrics_routes(registry), args.host, args.metrics_port)]
    logging.info("metrics on http://%s:%d/metrics", args.host, args.metrics_port)
    if ssl_ctx is not None:
        servers.append(start_server(api_routes(ExternalMetricsAPI(state)), args.host, args.api_port, ssl_ctx))
        logging.info("External Metrics API on https://%s:%d/apis/external.metrics.k8s.io/v1beta1, KEDA metrics-api on "
                     "https://%s:%d/keda/v1/scaler", args.host, args.api_port, args.host, args.api_port)
    grpc_server = None
    if args.keda_grpc_port:
        from forecaster.keda_grpc import start_grpc_server

        try:
            grpc_server, _ = start_grpc_server(state, args.host, args.keda_grpc_port,
                                               *((str(cert), str(key)) if grpc_tls else (None, None)))
        except (ValueError, RuntimeError) as exc:
            raise UsageError(str(exc)) from None
        logging.info("KEDA external scaler (gRPC%s) on %s:%d", " over TLS" if grpc_tls else ", plaintext",
                     args.host, args.keda_grpc_port)
    try:
        recorder = Recorder(args.record) if args.record else None
    except OSError as exc:
        raise UsageError(f"--record {args.record}: {exc.strerror or exc}") from None
    runner = Runner(source, policy, state, config.step_seconds, recorder=recorder)
    runner.warm_up(args.warmup_seconds)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        runner.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        for s in servers:
            s.shutdown()
        if grpc_server is not None:
            grpc_server.stop(grace=1)
        source.close()
        policy.close()
        if runner.recorder is not None:
            runner.recorder.close()
    return 0


def add_run_command(registry) -> None:
    p = registry.command("forecaster run", "run the forecaster and External Metrics API", run)
    src = p.add_argument_group("source (choose one)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus server to query, e.g. http://prometheus:9090")
    src.add_argument("--query", action="append", metavar="NAME=PROMQL",
                     help="override one query (names: arrivals, good, input_tokens, output_tokens, preemptions, "
                          "in_flight, queue_waiting, running, kv_cache_usage, ready_replicas, starting_replicas); "
                          "{window} is the rate window")
    src.add_argument("--rate-window", default="1m", help="rate() window in the default queries (default 1m)")
    src.add_argument("--warmup-seconds", type=float, default=86400.0,
                     help="history read from Prometheus at start (default 86400; 0 = start cold)")
    src.add_argument("--targets", metavar="HOST:PORT,...", help="scrape these sidecars' /metrics directly")
    src.add_argument("--kube-service", metavar="NAME", help="scrape the pods of this Service (EndpointSlices)")
    src.add_argument("--kube-namespace", default="default", help="namespace of --kube-service (default default)")
    src.add_argument("--kube-port-name", default=None, help="EndpointSlice port name of the sidecar metrics")
    src.add_argument("--kube-api", default=None, help="Kubernetes API URL (default: in-cluster, then kubeconfig)")
    src.add_argument("--record", metavar="FILE", default=None,
                     help="append every sample read and the replicas starting to FILE (JSON lines, about 2 KB "
                          "a step: 10 MB a day at 15-s steps), to decide again on later with `goodput "
                          "forecaster replay FILE`")
    add_policy_arguments(p)
    out = p.add_argument_group("serving")
    out.add_argument("--host", default="0.0.0.0")
    out.add_argument("--metrics-port", type=int, default=9090, help="plain HTTP /metrics (default 9090)")
    out.add_argument("--api-port", type=int, default=8443, help="HTTPS External Metrics API and KEDA metrics-api /keda/v1/scaler (default 8443; 0 = off)")
    out.add_argument("--keda-grpc-port", type=int, default=0,
                     help="KEDA external scaler (gRPC externalscaler.ExternalScaler) on this port, TLS with the "
                          "API's certificate (default 0 = off)")
    out.add_argument("--keda-grpc-plaintext", action="store_true",
                     help="serve --keda-grpc-port without TLS (a trusted network only)")
    out.add_argument("--tls-cert-file", default=None)
    out.add_argument("--tls-private-key-file", default=None)
    out.add_argument("--tls-client-ca-file", default=None,
                     help="require API clients to present a certificate signed by this CA (PEM); default: any client")
    out.add_argument("--self-signed", action="store_true", help="generate a self-signed certificate (development)")
    out.add_argument("--tls-dir", default=None, help="where --self-signed writes cert.pem/key.pem (default: a temporary directory, removed at exit)")
    out.add_argument("--tls-host", action="append", help="SAN for --self-signed (repeatable; default localhost, 127.0.0.1)")


def add_policy_arguments(p) -> None:
    pol = p.add_argument_group("policy")
    pol.add_argument("--step", type=float, default=15.0, help="seconds between samples (default 15)")
    pol.add_argument("--horizon", type=float, default=180.0, help="forecast horizon, s (default 180 = cold start)")
    pol.add_argument("--cold-start", type=float, default=None, help="replica cold start, s (default: learned from the EndpointSlices, pods not ready "
                          "until ready; --horizon until one is seen)")
    pol.add_argument("--capacity", type=float, default=None, help="requests/s one replica serves within SLO")
    pol.add_argument("--capacity-from", default=None, help="a `goodput sweep` sweep.json or its folder (knee rate)")
    pol.add_argument("--prior", default=None, metavar="FILE",
                     help="optional prior for the learned service model: a `goodput bench engine --json` result "
                          "(seeds the decode/prefill fit) or a `goodput sweep` sweep.json (capacity until the "
                          "model is learned); default: none, learned from the fleet alone")
    pol.add_argument("--target-queue", type=float, default=0.0, help="requests allowed waiting at the horizon, fleet-wide")
    pol.add_argument("--min-replicas", type=int, default=1)
    pol.add_argument("--max-replicas", type=int, default=100)
    pol.add_argument("--scale-down-window", type=float, default=300.0, help="stabilisation window, s (default 300)")
    pol.add_argument("--fit-timeout", type=float, default=2.0, help="longest a model fit may take, s (default 2)")
    pol.add_argument("--refit-every", type=float, default=300.0, help="seconds between model re-selections (default 300)")
    pol.add_argument("--models", default="level,holt_winters", help="candidate models, first = default")


def replay_run(args: argparse.Namespace) -> int:
    from forecaster.policy import ForecastPolicy
    from forecaster.replay import RecordingError, read_recording, replay

    if not Path(args.recording).is_file():
        raise UsageError(f"{args.recording}: no such recording (write one with `goodput forecaster run --record FILE`)")
    try:
        policy = ForecastPolicy(policy_config(args, background_selection=False))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    t0, decided, counts = None, 0, []
    try:
        for line, d in replay(policy, read_recording(args.recording)):
            if d is None:
                continue
            t = float(line["t"])
            t0 = t if t0 is None else t0
            decided += 1
            counts.append(d.desired_replicas)
            sample = line["sample"]
            m = d.service.model if d.service is not None else None
            fitted = "" if m is None else (f" step={1e3 * m.decode_base_s:.1f}+{1e3 * m.decode_per_seq_s:.2f}·b"
                                           f"+{1e3 * m.decode_log_s:.1f}·ln b ms prefill={m.prefill_tokens_per_s:.0f} tok/s")
            print(f"{t - t0:8.1f} s desired={d.desired_replicas} ({'+'.join(d.reasons)}) ready={sample.ready_replicas} "
                  f"in_flight={sample.in_flight:.0f} rate={d.arrival_rate_mean:.2f}/{d.arrival_rate_upper:.2f} "
                  f"capacity={d.capacity_rps:.2f} ({d.capacity_source}) model={d.model_name}{fitted}")
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    finally:
        policy.close()
    if not decided:
        raise UsageError(f"{args.recording}: no decided step in the recording")
    print(f"{decided} steps decided; desired replicas {min(counts)}-{max(counts)}")
    return 0


def add_replay_command(registry) -> None:
    p = registry.command("forecaster replay", "decide again on what `forecaster run --record` recorded", replay_run)
    p.add_argument("recording", help="a JSON-lines file written by `goodput forecaster run --record FILE`")
    add_policy_arguments(p)
