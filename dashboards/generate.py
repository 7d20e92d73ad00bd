"""Write the generated artefacts: dashboards JSON and rules YAML, byte-identical between runs."""

from __future__ import annotations

from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import autoscaling, engine_kv, goodput_slo, rules

# Where the committed copies live; the Helm chart reads them from here through helm/goodput/files.
GENERATED = Path(__file__).resolve().parent / "generated"
DASHBOARDS = {goodput_slo.UID: goodput_slo, engine_kv.UID: engine_kv, autoscaling.UID: autoscaling}
RULES_FILES = {"prometheus": "goodput-rules.yaml", "prometheus-operator": "goodput-prometheusrule.yaml"}


def dashboard_json(uid: str) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(DASHBOARDS[uid].build().build()) + "\n"


def write_dashboards(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid in DASHBOARDS:
        path = out / f"{uid}.json"
        path.write_text(dashboard_json(uid))
        written.append(path)
    return written


def write_rules(path: Path, format: str, config: rules.RulesConfig | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rules.render(rules.build_groups(config), format))
    return path


def write_all(root: Path = GENERATED) -> list[Path]:
    """Everything committed under dashboards/generated/ (the chart and the tests read these)."""
    written = write_dashboards(root)
    for format, filename in RULES_FILES.items():
        written.append(write_rules(root / "rules" / filename, format))
    return written
