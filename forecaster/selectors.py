"""Kubernetes label selectors (the `labelSelector` query parameter), as a predicate on labels.

Supports the forms HPA and kubectl send: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`,
`k` (exists) and `!k` (does not exist), comma-separated and all required.
"""

from __future__ import annotations

import re
from typing import Callable

_SET = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*$")


def _split(text: str) -> list[str]:
    """Splits on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return parts


def parse_selector(text: str) -> Callable[[dict[str, str]], bool]:
    tests: list[Callable[[dict[str, str]], bool]] = []
    for part in _split(text or ""):
        if m := _SET.match(part):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := _EQ.match(part):
            key, op, value = m.groups()
            if op == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := _EXISTS.match(part):
            negate, key = m.groups()
            tests.append(lambda labels, k=key, neg=bool(negate): (k in labels) != neg)
        else:
            raise ValueError(f"cannot parse {part.strip()!r}; use key=value, key!=value, key in (a,b) or key")
    return lambda labels: all(t(labels) for t in tests)
