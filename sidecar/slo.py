"""SLO classes and the one verdict each request ends with.

A request is `good` when every objective its class sets holds (TTFT, TPOT, and E2E when given),
as `vllm bench serve --goodput` decides it; a target is met when the measured value is at or
under it. The verdict is decided once, at the end, from the finished `RequestTiming`. A request the admission guard refused (sidecar/admission.py)
ends `shed`: it was never served, and it is not good.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sidecar.timing import RequestTiming

OUTCOMES = ("good", "slo_violated", "error", "cancelled", "shed")
OBJECTIVES = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class SloClass:
    name: str
    ttft: float                 # seconds
    tpot: float                 # seconds per output token after the first
    e2e: float | None = None    # seconds, optional
    objective: float = 0.99     # share of requests that should be good
    # Admission (sidecar/admission.py): refuse at once a request whose predicted TTFT exceeds
    # (1 - admission_margin) x ttft, or whose predicted TPOT exceeds (1 - admission_margin) x tpot.
    # Under sustained overload the queue (or the batch) settles at that threshold,
    # so the margin must cover the prediction's error for admitted requests to still meet `ttft`;
    # a negative margin tolerates predicted misses instead. Off by default: shedding is a choice.
    admission: bool = False
    admission_margin: float = 0.2
    priority: int = 0           # higher is shed later; lower classes are refused first
    # A request the decode batch has no room for waits in the sidecar for a slot while its TTFT
    # threshold allows the wait, rather than being refused at once (false: refuse at once, so the
    # client can retry elsewhere without waiting here).
    admission_hold: bool = True

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"SLO class name must be a non-empty string, got {self.name!r}")
        for key in ("ttft", "tpot", "e2e"):
            value = getattr(self, key)
            if value is None and key == "e2e":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"SLO class {self.name!r}: {key} must be a number of seconds > 0, got {value!r}")
        # <= 1 here because the load generator accepts 1; the config file insists on < 1 (an
        # objective of 1 leaves no error budget, so burn-rate alerts would divide by zero).
        if not isinstance(self.objective, (int, float)) or not 0 < self.objective <= 1:
            raise ValueError(f"SLO class {self.name!r}: objective must be a ratio with 0 < objective < 1 "
                             f"(e.g. 0.99), got {self.objective!r}")

        if not isinstance(self.admission, bool):
            raise ValueError(f"SLO class {self.name!r}: admission must be true or false, got {self.admission!r}")
        if (not isinstance(self.admission_margin, (int, float)) or isinstance(self.admission_margin, bool)
                or not -1 <= self.admission_margin < 1):
            raise ValueError(f"SLO class {self.name!r}: admission_margin must be a fraction of ttft in [-1, 1) "
                             f"(0.2 = shed when predicted TTFT > 0.8 x ttft), got {self.admission_margin!r}")
        if not isinstance(self.admission_hold, bool):
            raise ValueError(f"SLO class {self.name!r}: admission_hold must be true or false, got {self.admission_hold!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(f"SLO class {self.name!r}: priority must be an integer (higher is shed later), "
                             f"got {self.priority!r}")

    def targets(self) -> dict[str, float]:
        """The objectives this class sets, by name."""
        out = {"ttft": float(self.ttft), "tpot": float(self.tpot)}
        if self.e2e is not None:
            out["e2e"] = float(self.e2e)
        return out


@dataclass(frozen=True)
class Verdict:
    outcome: str                                  # good | slo_violated | error | cancelled | shed
    violated: list[str] = field(default_factory=list)   # subset of ttft | tpot | e2e


def judge(timing: RequestTiming, slo_class: SloClass, error: str | None = None,
          cancelled: bool = False, shed: bool = False) -> Verdict:
    """The request's single outcome. Cancelled wins over error (the client left first, and
    whatever failed after that is a consequence); error wins over SLO checks. A shed request was
    answered 429 before it reached the engine: nothing else about it can be judged.

    A stream that finished cleanly without any content (e.g. max_tokens reached on an empty
    answer) is judged on TTFT with its E2E: the user waited that long for the (empty) answer.
    """
    if cancelled:
        return Verdict("cancelled")
    if shed:
        return Verdict("shed")
    if error is not None or timing.error is not None:
        return Verdict("error")
    violated = []
    ttft = timing.ttft if timing.ttft is not None else timing.e2e
    if ttft > slo_class.ttft:
        violated.append("ttft")
    if timing.tpot is not None and timing.tpot > slo_class.tpot:
        violated.append("tpot")
    if slo_class.e2e is not None and timing.e2e > slo_class.e2e:
        violated.append("e2e")
    return Verdict("slo_violated", violated) if violated else Verdict("good")
