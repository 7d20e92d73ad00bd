"""Sidecar configuration: the SLO config file and the proxy's own settings, validated at the edge.

SLO config file (`--slo-config FILE`, the shape the Helm chart renders):

    default_class: interactive
    classes:
      - {name: interactive, ttft: 0.5, tpot: 0.05, e2e: 30, objective: 0.99}
      - {name: batch, ttft: 10, tpot: 0.2, objective: 0.95}
    # optional per class: admission: true (shed requests predicted to miss ttft or tpot, answering 429),
    # admission_margin: 0.2 (shed above 0.8 x ttft or 0.8 x tpot: room for the prediction's error), priority: 0
    # (higher is shed later), admission_hold: true (wait in the sidecar for a decode slot while ttft allows)
    rules:                             # first match wins; then default_class
      - header: x-slo-class            # the header's value names the class (ignored if unknown)
      - model: "llama-batch-*"         # glob on the request's model
        class: batch
      - path: /v1/completions          # path prefix
        class: batch

Without a file, DEFAULT_SLO_CONFIG applies: one class `interactive` (TTFT 1 s, TPOT 0.1 s,
objective 0.99) and the `x-slo-class` header rule.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import yaml

from sidecar.slo import SloClass


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file, the key and what is expected."""


@dataclass(frozen=True)
class Rule:
    kind: str                    # header | model | path
    value: str                   # header name (lower case) | glob | path prefix
    slo_class: str | None        # None only for header rules: the header's value names the class


@dataclass(frozen=True)
class SloConfig:
    classes: dict[str, SloClass]
    default_class: str
    rules: tuple[Rule, ...] = ()

    def classify(self, model: str | None, path: str, headers: Mapping[str, str]) -> SloClass:
        """The request's class: the first matching rule, else the default.

        `headers` is looked up with lower-case names (aiohttp's CIMultiDict is case-insensitive).
        """
        for rule in self.rules:
            if rule.kind == "header":
                value = headers.get(rule.value)
                if value is not None and value.strip() in self.classes:
                    return self.classes[value.strip()]
            elif rule.kind == "header_present":
                if headers.get(rule.value) is not None:
                    return self.classes[rule.slo_class]
            elif rule.kind == "model":
                if model is not None and fnmatch.fnmatchcase(model, rule.value):
                    return self.classes[rule.slo_class]
            elif path.startswith(rule.value):
                return self.classes[rule.slo_class]
        return self.classes[self.default_class]


DEFAULT_SLO_CONFIG = SloConfig(
    classes={"interactive": SloClass("interactive", ttft=1.0, tpot=0.1, objective=0.99)},
    default_class="interactive",
    rules=(Rule("header", "x-slo-class", None),),
)


CLASS_KEYS = ("name", "ttft", "tpot", "e2e", "objective", "admission", "admission_margin", "priority",
              "admission_hold")


def load_slo_config(path: str | Path) -> SloConfig:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the SLO config file ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_slo_config(doc, str(path))


def parse_slo_config(doc: object, where: str = "SLO config") -> SloConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a mapping with keys classes, default_class, rules; got {type(doc).__name__}")
    unknown = set(doc) - {"classes", "default_class", "rules"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: classes, default_class, rules")
    raw_classes = doc.get("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise ConfigError(f"{where}: 'classes' must be a non-empty list of {{name, ttft, tpot, e2e?, objective?}}")
    classes: dict[str, SloClass] = {}
    for i, item in enumerate(raw_classes):
        classes_key = f"{where}: classes[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{classes_key}: expected a mapping with name, ttft, tpot, e2e?, objective?")
        extra = set(item) - set(CLASS_KEYS)
        if extra:
            raise ConfigError(f"{classes_key}: unknown key(s) {sorted(extra)}; allowed: {', '.join(CLASS_KEYS)}")
        for key in ("name", "ttft", "tpot"):
            if key not in item:
                raise ConfigError(f"{classes_key}: missing required key '{key}'")
        name = item["name"]
        objective = item.get("objective", 0.99)
        if isinstance(objective, (int, float)) and not isinstance(objective, bool) and objective >= 1:
            raise ConfigError(f"{classes_key}.objective: must be 0 < objective < 1 (e.g. 0.99), got {objective!r}")
        try:
            slo = SloClass(name=name, ttft=item["ttft"], tpot=item["tpot"], e2e=item.get("e2e"), objective=objective,
                           admission=item.get("admission", False), admission_margin=item.get("admission_margin", 0.2),
                           priority=item.get("priority", 0), admission_hold=item.get("admission_hold", True))
        except ValueError as exc:
            raise ConfigError(f"{classes_key}: {exc}") from None
        if name in classes:
            raise ConfigError(f"{classes_key}.name: class {name!r} is defined twice")
        classes[name] = slo
    default = doc.get("default_class", next(iter(classes)))
    if default not in classes:
        raise ConfigError(f"{where}: default_class {default!r} names no class; defined: {sorted(classes)}")
    rules = []
    for i, item in enumerate(doc.get("rules") or []):
        rules.append(_rule(item, classes, f"{where}: rules[{i}]"))
    return SloConfig(classes=classes, default_class=default, rules=tuple(rules))


def _rule(item: object, classes: dict[str, SloClass], key: str) -> Rule:
    if not isinstance(item, dict):
        raise ConfigError(f"{key}: expected a mapping with one of header, model, path (and class)")
    kinds = [k for k in ("header", "model", "path") if k in item]
    extra = set(item) - {"header", "model", "path", "class"}
    if len(kinds) != 1 or extra:
        raise ConfigError(f"{key}: expected exactly one of header, model, path plus 'class'; got keys {sorted(item)}")
    kind = kinds[0]
    value = item[kind]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}.{kind}: expected a non-empty string, got {value!r}")
    target = item.get("class")
    if kind == "header":
        if target is not None and target not in classes:
            raise ConfigError(f"{key}.class: {target!r} names no class; defined: {sorted(classes)}")
        # A header rule with a class means "header present -> that class".
        return Rule("header_present" if target else "header", value.lower(), target)
    if target is None:
        raise ConfigError(f"{key}: a {kind} rule needs 'class' naming one of {sorted(classes)}")
    if target not in classes:
        raise ConfigError(f"{key}.class: {target!r} names no class; defined: {sorted(classes)}")
    if kind == "path" and not value.startswith("/"):
        raise ConfigError(f"{key}.path: expected a path prefix starting with '/', got {value!r}")
    return Rule(kind, value, target)


@dataclass
class ProxyConfig:
    """The proxy's settings (from the command line), validated where built."""

    upstream: str
    host: str = "127.0.0.1"
    port: int = 8080
    slo: SloConfig = field(default_factory=lambda: DEFAULT_SLO_CONFIG)
    models: tuple[str, ...] = ()
    engine_metrics_interval: float = 5.0     # 0 switches the scraper off
    drain_timeout: float = 30.0
    max_body_bytes: int = 16 * 1024 * 1024
    capture_content: bool = False
    connect_timeout: float = 5.0
    read_timeout: float = 600.0              # no upstream byte for this long -> 504
    inject_usage: bool = True                # ask for usage on streams, strip it unless the client asked
    advice_window: int = 256                 # prompts per model and tenant for /advice (0 = off)
    genai_provider: str = "openai"           # gen_ai.provider.name on spans and OTel metrics (the API dialect)
    otel_legacy_metrics: bool = False        # also the OTel GenAI metric names of semconv <= v1.41
    http_server: str = "fast"             # "fast": sidecar.fastserver; "aiohttp": aiohttp's server

    def __post_init__(self):
        from urllib.parse import urlsplit
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--upstream must be an http(s) URL like http://127.0.0.1:8000, got {self.upstream!r}")
        self.upstream = self.upstream.rstrip("/")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be 0..65535, got {self.port}")
        if self.engine_metrics_interval < 0:
            raise ValueError(f"--engine-metrics-interval must be >= 0 seconds (0 = off), got {self.engine_metrics_interval}")
        if self.drain_timeout < 0:
            raise ValueError(f"--drain-timeout must be >= 0 seconds, got {self.drain_timeout}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"--max-body-bytes must be > 0, got {self.max_body_bytes}")
        if self.advice_window < 0:
            raise ValueError(f"--advice-window must be >= 0 prompts (0 = off), got {self.advice_window}")
        if not self.genai_provider or len(self.genai_provider) > 64:
            raise ValueError(f"--genai-provider must be a short name like openai or vllm, got {self.genai_provider!r}")
        if self.http_server not in ("fast", "aiohttp"):
            raise ValueError(f"--http-server must be fast or aiohttp, got {self.http_server!r}")
        if self.read_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("upstream timeouts must be > 0 seconds")
