"""`goodput dashboards generate|preview` and `goodput rules generate`."""

from __future__ import annotations

import argparse
from pathlib import Path

from goodput_cli.errors import UsageError


def _generate_dashboards(args: argparse.Namespace) -> int:
    from dashboards import generate

    for path in generate.write_dashboards(Path(args.out)):
        print(path)
    return 0


def _generate_rules(args: argparse.Namespace) -> int:
    from dashboards import generate, rules

    try:
        config = rules.RulesConfig(runbook_base=args.runbook_base)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    path = generate.write_rules(Path(args.out), args.format, config)
    groups = rules.build_groups(config)
    count = sum(len(g["rules"]) for g in groups)
    print(f"{path}: {len(groups)} groups, {count} rules ({len(rules.alert_names(groups))} alerts), format {args.format}")
    return 0


def _preview(args: argparse.Namespace) -> int:
    import httpx
    from rich.progress import Progress

    from dashboards import generate, preview

    source = Path(args.dashboards)
    if not sorted(source.glob("*.json")):
        raise UsageError(f"no dashboard JSON in {source}: run `goodput dashboards generate --out {source}` first")
    if args.range < 60:
        raise UsageError(f"--range {args.range}: use at least 60 seconds")
    out = Path(args.out)
    try:
        with Progress(transient=True) as progress:
            progress.add_task("rendering dashboards from Prometheus", total=None)
            paths = preview.render_all(args.prometheus, source, out, range_seconds=args.range,
                                       rate_interval=args.rate_interval)
    except httpx.HTTPError as exc:
        raise UsageError(f"cannot query Prometheus at {args.prometheus} ({exc}); check --prometheus") from exc
    except RuntimeError as exc:  # Prometheus answered with an error for one query
        raise UsageError(f"Prometheus at {args.prometheus} rejected a query: {exc}") from exc
    for path in paths:
        print(path)
    return 0


def register(registry) -> None:
    from dashboards.rules import FORMATS

    default_dir = "dashboards/generated"
    p = registry.command("dashboards generate", "write the Grafana dashboards JSON", _generate_dashboards)
    p.add_argument("--out", default=default_dir, help=f"directory for the *.json files (default {default_dir})")

    p = registry.command("rules generate", "write the alerting and recording rules", _generate_rules)
    p.add_argument("--out", required=True, help="rules file to write (YAML)")
    p.add_argument("--format", choices=FORMATS, default="prometheus",
                   help="prometheus: a rules file with groups; prometheus-operator: a PrometheusRule object")
    p.add_argument("--runbook-base", default="README.md",
                   help="URL of the README that holds the runbooks; alerts link to its #runbook-<alert> anchors")

    p = registry.command("dashboards preview", "render dashboard panels from a live Prometheus to PNG", _preview)
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--out", required=True, help="directory for one PNG per dashboard")
    p.add_argument("--dashboards", default=default_dir, help=f"directory of dashboard JSON (default {default_dir})")
    p.add_argument("--range", type=int, default=3600, help="seconds of history to draw (default 3600)")
    p.add_argument("--rate-interval", default="1m",
                   help="value for Grafana's $__rate_interval (default 1m; use ~4 scrape intervals)")
