"""What the trace readers return: plain records, no numpy, so any package can take them."""

from __future__ import annotations

from dataclasses import dataclass, field


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file (and line) and what was wrong."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a per-request trace, as the file records it (times re-based, nothing clamped)."""

    arrival_s: float       # seconds from the trace's first request
    input_tokens: int
    output_tokens: int
    # Prefix-block ids (Mooncake only): requests sharing the first k ids share that many prefix blocks.
    hash_ids: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class ClientWindows:
    """One ServeGen client's rows, column by column (2,016 rows x 162 clients: columns, not records).

    Rows keep the file's order. `distribution` is "" where the window had no traffic (rate 0).
    """

    client: int
    window_start_s: list[float]
    rate: list[float]              # requests/s in the window
    cv: list[float]                # coefficient of variation of inter-arrival gaps
    distribution: list[str]        # fitted inter-arrival family: "Gamma", "Weibull" or ""
    shape: list[float]
    scale: list[float]

    def __len__(self) -> int:
        return len(self.window_start_s)
