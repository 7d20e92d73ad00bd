"""values.yaml is documented key by key, and values.schema.json describes every key it has.

"Chart keys" are those the schema lists under `properties`; the contents of opaque Kubernetes
objects (securityContext, behavior, resources, list items) are documented by Kubernetes and are
exempt.
"""

from __future__ import annotations

import json
import re

import yaml

from tests.helm.chart import CHART

VALUES_TEXT = (CHART / "values.yaml").read_text()
SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def _chart_key_lines():
    """(line number, dotted path) of every key line whose path the schema defines."""
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(VALUES_TEXT.splitlines(), 1):
        mo = re.match(r"^( *)([A-Za-z_][\w-]*):", line)
        if not mo:
            continue
        indent = len(mo.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [mo.group(2)]
        stack.append((indent, mo.group(2)))
        node = SCHEMA
        for key in path:
            node = node.get("properties", {}).get(key)
            if node is None:
                break
        if node is not None:
            yield number, ".".join(path), node


def test_every_chart_key_has_a_comment_above_it():
    lines = VALUES_TEXT.splitlines()
    undocumented = [f"line {n}: {path}" for n, path, _ in _chart_key_lines() if not lines[n - 2].strip().startswith("#")]
    assert undocumented == []


def test_every_value_is_in_the_schema_with_a_description():
    def walk(values: dict, schema: dict, path: str):
        for key, value in values.items():
            prop = schema.get("properties", {}).get(key)
            assert prop is not None, f"{path}{key} is not in values.schema.json"
            assert prop.get("description"), f"{path}{key} has no description in values.schema.json"
            if isinstance(value, dict) and "properties" in prop:
                walk(value, prop, f"{path}{key}.")

    walk(yaml.safe_load(VALUES_TEXT), SCHEMA, "")


def test_the_key_walk_reaches_nested_keys():
    # The comment check is only as good as its walk: it must see nested chart keys such as
    # serving.drain.timeoutSeconds, not stop at the top level (116 key lines today).
    paths = {path for _, path, _ in _chart_key_lines()}
    assert {"serving.drain.timeoutSeconds", "autoscaling.builtin.caBundle", "monitoring.dashboards.label"} <= paths
    assert "serving.podSecurityContext.runAsUser" not in paths  # inside an opaque Kubernetes object
