"""SLO config file: the chart's exact shape, rule order, refusals that name the problem; verdicts."""

from __future__ import annotations

import pytest

from sidecar.config import DEFAULT_SLO_CONFIG, ConfigError, load_slo_config
from sidecar.slo import SloClass, judge
from sidecar.timing import RequestTiming

CHART_SHAPE = """\
default_class: interactive
classes:
  - name: interactive
    ttft: 0.5        # seconds, > 0
    tpot: 0.05       # seconds, > 0
    e2e: 30          # optional
    objective: 0.99  # 0 < x < 1
  - name: batch
    ttft: 10
    tpot: 0.2
    objective: 0.95
rules:             # first match wins; then default_class
  - header: x-slo-class          # the header's value names the class (ignored if it names no class)
  - model: "llama-batch-*"       # glob on the request's model
    class: batch
  - path: /v1/completions        # path prefix
    class: batch
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text(CHART_SHAPE)
    return load_slo_config(path)


def test_chart_shape_loads(config):
    assert config.default_class == "interactive"
    assert config.classes["interactive"] == SloClass("interactive", ttft=0.5, tpot=0.05, e2e=30, objective=0.99)
    assert config.classes["batch"] == SloClass("batch", ttft=10, tpot=0.2, e2e=None, objective=0.95)


@pytest.mark.parametrize("model, path, headers, expected", [
    ("llama-batch-7b", "/v1/chat/completions", {}, "batch"),           # model glob
    ("llama-chat", "/v1/completions", {}, "batch"),                    # path prefix
    ("llama-chat", "/v1/chat/completions", {}, "interactive"),         # nothing matches: default
    ("llama-batch-7b", "/v1/chat/completions", {"x-slo-class": "interactive"}, "interactive"),  # header first
    ("llama-batch-7b", "/v1/chat/completions", {"x-slo-class": "gold"}, "batch"),  # unknown class: ignored
    (None, "/v1/chat/completions", {}, "interactive"),                 # no model: globs cannot match
])
def test_first_matching_rule_wins(config, model, path, headers, expected):
    assert config.classify(model, path, headers).name == expected


def test_default_config_is_documented_values():
    slo = DEFAULT_SLO_CONFIG.classify("any", "/v1/chat/completions", {})
    assert (slo.name, slo.ttft, slo.tpot, slo.e2e, slo.objective) == ("interactive", 1.0, 0.1, None, 0.99)


@pytest.mark.parametrize("text, message", [
    ("classes: []", "'classes' must be a non-empty list"),
    ("classes:\n  - {name: a, ttft: 0, tpot: 0.1}", r"classes\[0\]: SLO class 'a': ttft must be a number of seconds > 0, got 0"),
    ("classes:\n  - {name: a, ttft: 1, tpot: 0.1, objective: 1}", r"classes\[0\].objective: must be 0 < objective < 1"),
    ("classes:\n  - {name: a, ttft: 1}", r"classes\[0\]: missing required key 'tpot'"),
    ("classes:\n  - {name: a, ttft: 1, tpot: 0.1, p99: 3}", r"classes\[0\]: unknown key\(s\) \['p99'\]"),
    ("classes:\n  - {name: a, ttft: 1, tpot: 0.1}\ndefault_class: b", "default_class 'b' names no class; defined: \\['a'\\]"),
    ("classes:\n  - {name: a, ttft: 1, tpot: 0.1}\nrules:\n  - {model: 'x*'}", r"rules\[0\]: a model rule needs 'class'"),
    ("classes:\n  - {name: a, ttft: 1, tpot: 0.1}\nrules:\n  - {path: /v1, class: z}", r"rules\[0\].class: 'z' names no class"),
    ("classes: [", "not valid YAML"),
])
def test_invalid_config_names_file_key_and_expectation(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_slo_config(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_slo_config(tmp_path / "nope.yaml")


def timing(ttft, tpot, e2e, tokens=10, error=None):
    return RequestTiming(ttft=ttft, e2e=e2e, itl=[], tpot=tpot, output_tokens=tokens, input_tokens=None,
                         finish_reasons=[], error=error, usage_seen=False, model=None)


SLO = SloClass("i", ttft=0.5, tpot=0.05, e2e=3.0)


@pytest.mark.parametrize("t, outcome, violated", [
    (timing(0.5, 0.05, 3.0), "good", []),                     # exactly on every target is good
    (timing(0.6, 0.04, 1.0), "slo_violated", ["ttft"]),
    (timing(0.2, 0.06, 1.0), "slo_violated", ["tpot"]),
    (timing(0.2, 0.04, 3.5), "slo_violated", ["e2e"]),
    (timing(0.6, 0.5, 5.1), "slo_violated", ["ttft", "tpot", "e2e"]),
    (timing(None, None, 0.7, tokens=0), "slo_violated", ["ttft"]),   # empty answer: judged on E2E as TTFT
    (timing(0.1, None, 0.2, tokens=1), "good", []),           # one token: no TPOT to judge
    (timing(0.1, 0.01, 0.2, error="boom"), "error", []),
])
def test_judge(t, outcome, violated):
    v = judge(t, SLO)
    assert (v.outcome, v.violated) == (outcome, violated)


def test_cancelled_wins_over_error_and_error_over_slo():
    assert judge(timing(0.1, 0.01, 0.2, error="x"), SLO, error="y", cancelled=True).outcome == "cancelled"
    assert judge(timing(9.0, 0.01, 9.2), SLO, error="upstream_timeout").outcome == "error"
