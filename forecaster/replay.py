"""Recording what the forecaster read, and deciding again on it: why did it ask for that?

`goodput forecaster run --record FILE` appends one JSON line per step: the time, the fleet sample
its source read, the replicas starting and the cold start the source learned (a warm-up sample from
history is marked `warm`, observed but not decided on). `goodput forecaster replay FILE` feeds
those lines to a fresh policy built from the same policy flags, with no source and no servers, and
prints every decision as the live log does, with the capacity it planned on and the service model's
fitted parameters. So a decision that surprised someone can be read again step by step, and a change
to the policy tried on the very traffic that surprised it.

A replay selects forecasting models in the foreground at the recorded times (the live forecaster
selects in a thread, whenever the last selection finished), so where a selection would have landed
a step later live, a replay can choose differently for that step; everything else is the same
computation on the same inputs.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Iterator

from forecaster.fleet_sample import FleetSample
from forecaster.service_model import Slo

_FIELDS = {f.name for f in fields(FleetSample)}
_FLOAT_KEYED = ("input_token_hist_total", "output_token_hist_total", "arrivals_squared_total")


def _number(x):
    """JSON has no NaN or infinity: those as strings, read back by `_float`."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def sample_to_json(sample: FleetSample) -> dict:
    out = {}
    for name, value in asdict(sample).items():
        if name == "slos":
            value = None if value is None else [dict(s) for s in value]
        elif isinstance(value, dict):
            value = {repr(float(k)): _number(v) for k, v in value.items()}
        else:
            value = _number(value)
        out[name] = value
    return out


def _plain(x):
    """A numpy scalar a source may hand over (np.int64 is no int to json) as its Python value."""
    if hasattr(x, "item"):
        return _number(x.item())
    raise TypeError(f"{type(x).__name__} is not a number")


def _float(x):
    return float(x) if isinstance(x, str) else x


def sample_from_json(doc: dict) -> FleetSample:
    unknown = set(doc) - _FIELDS
    if unknown:
        raise ValueError(f"unknown fleet sample fields {sorted(unknown)} (recorded by a newer goodput?)")
    values = {}
    for name, value in doc.items():
        if name == "slos":
            value = None if value is None else tuple(Slo(**s) for s in value)
        elif name in _FLOAT_KEYED and value is not None:
            value = {float(k): _float(v) for k, v in value.items()}
        elif name != "ready_replicas":
            value = _float(value)
        values[name] = value
    return FleetSample(**values)


class Recorder:
    """Appends the forecaster's inputs to a JSON-lines file, one line a step, flushed as written
    (a recording cut short by a crash keeps every step before it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")

    def write(self, t: float, sample: FleetSample, starting: int = 0, cold_start: float | None = None,
              warm: bool = False) -> None:
        line = {"t": t, "sample": sample_to_json(sample), "starting": starting}
        if cold_start is not None:
            line["cold_start"] = cold_start
        if warm:
            line["warm"] = True
        self._file.write(json.dumps(line, allow_nan=False, default=_plain) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class RecordingError(ValueError):
    """A recording that cannot be read (not a bug in the policy deciding on it)."""


def read_recording(path: str | Path) -> Iterator[dict]:
    """The recorded steps, in order (a `.gz` file is read through gzip); a line that is not one is
    an error naming it, unless it is the last (a recording cut short mid-write)."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        else:
            lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise RecordingError(f"{path}: not readable ({exc})") from None
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            line["sample"] = sample_from_json(line["sample"])
            float(line["t"])
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):
                return   # the last line of a recording cut short
            raise RecordingError(f"{path}:{number}: not a recorded step ({exc})") from None
        yield line


def replay(policy, steps) -> Iterator[tuple[dict, object]]:
    """Each recorded step and the decision `policy` makes on it (None for a warm-up sample)."""
    for line in steps:
        policy.observe(line["sample"])
        if line.get("warm"):
            yield line, None
            continue
        if "cold_start" in line:
            policy.learned_cold_start(line["cold_start"])
        yield line, policy.decide(float(line["t"]), int(line.get("starting", 0)))
