"""A request as the engine core sees it, and its sampling parameters."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError("seed must fit in 64 bits")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be integers")
        if self.top_k < -1:
            raise ValueError("top_k must be -1 or 0 (off) or a positive integer")

    @property
    def greedy(self) -> bool:
        # As vLLM: below 1e-5 the softmax of logits / temperature overflows; it is greedy anyway.
        return self.temperature < 1e-5


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache; the scheduler makes it catch up with num_tokens.
    num_computed_tokens: int = 0
    # Tokens served from the prefix cache when the request (last) started.
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # When the scheduler first ran it and when its first token was sampled (monotonic): vLLM's
    # scheduled_ts and first_token_ts, for the queue / prefill / decode split.
    scheduled_time: float | None = None
    first_token_time: float | None = None
    status: Status = Status.WAITING
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


@dataclass(frozen=True)
class RequestTimes:
    """Where a finished request's time went, as vLLM splits it (seconds): queue = first scheduled
    - arrival, prefill = first token - first scheduled, decode = last token - first token."""
    queue: float
    prefill: float
    decode: float

    @property
    def inference(self) -> float:
        return self.prefill + self.decode
