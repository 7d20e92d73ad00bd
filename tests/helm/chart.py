"""Render the chart with helm-python-sdk (Helm's own Go library) and hand back plain objects."""

from __future__ import annotations

import functools
from pathlib import Path

import helm_python
import yaml

from tests.support import REPO_ROOT

CHART = REPO_ROOT / "helm" / "goodput"
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*.yaml"))
RELEASE = "demo"
NAMESPACE = "serving"
FULLNAME = "demo-goodput"
FORECASTER = "demo-goodput-forecaster"


def values_of(name: str | None) -> dict:
    return yaml.safe_load((CHART / "ci" / name).read_text()) if name else {}


@functools.lru_cache(maxsize=None)
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def render_raw(values: dict) -> dict[str, str]:
    return _chart().render(values, name=RELEASE, namespace=NAMESPACE)


@functools.lru_cache(maxsize=None)
def _render_file(name: str | None) -> tuple:
    return tuple(_objects(render_raw(values_of(name))))


def render(values: str | dict | None = None) -> list[dict]:
    """Every rendered Kubernetes object; `values` is a ci/ file name, a dict, or None (defaults)."""
    if isinstance(values, dict):
        return _objects(render_raw(values))
    return [dict(o) for o in _render_file(values)]


def _objects(manifests: dict[str, str]) -> list[dict]:
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def kinds(objects: list[dict]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def files_root() -> Path:
    return CHART / "files"
