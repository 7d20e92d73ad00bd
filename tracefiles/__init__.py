"""One reader per trace format, shared by the load generator, the backtests and the simulator.

A neutral top-level package, standard library only: the sidecar's load generator and the
forecaster both import it, so neither imports the other (DESIGN.md: packages talk through small
dataclasses). Each reader returns plain records; each caller turns them into what it needs
(the load generator's `PlannedRequest`, the simulator's arrays, the backtests' interval series).

Formats:
- Azure LLM inference (Splitwise) CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`.
- Mooncake (FAST'25) JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
- BurstGPT CSV: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
- ServeGen client folder: `chunk-<client>-trace.csv`, per-client 10-minute windows (rates, not requests).
"""

from tracefiles.records import ClientWindows, TraceError, TraceRequest
from tracefiles.requests import (MOONCAKE_BLOCK_TOKENS, detect_format, read_azure, read_burstgpt, read_mooncake,
                                 read_requests, spread_ties)
from tracefiles.servegen import SERVEGEN_WINDOW_S, read_servegen

__all__ = [
    "ClientWindows", "MOONCAKE_BLOCK_TOKENS", "SERVEGEN_WINDOW_S", "TraceError", "TraceRequest", "detect_format",
    "read_azure", "read_burstgpt", "read_mooncake", "read_requests", "read_servegen", "spread_ties",
]
