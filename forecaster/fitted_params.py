"""The service model's learned parameters with their 90 % bands, as the forecaster exports
them (goodput_replica_*; OnlineServiceModel.params)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from forecaster.service_model import ServiceModel


@dataclass(frozen=True)
class FittedParams:
    """The learned parameters with a 90 % band each (for export and dashboards)."""

    model: ServiceModel
    decode_base_s: tuple[float, float]
    decode_per_seq_s: tuple[float, float]
    prefill_tokens_per_s: tuple[float, float]
    kv_capacity_tokens: tuple[float, float]
    prompt_mean: float
    output_mean: float
    num_steps: int
    ttft_overhead_s: tuple[float, float] = (0.0, 0.0)
    decode_single_s: tuple[float, float] = (math.nan, math.nan)   # one sequence alone
    decode_log_s: tuple[float, float] = (0.0, 0.0)                 # the step's concave part
    arrival_dispersion: float = 1.0                                # arrivals' index of dispersion at the prompt queue's scale
    wait_scale: float = 1.0                                        # learned (OnlineServiceModel.wait_scale)
    wait_scale_planned: float = 1.0                                # what planning uses now (1 while a burst is in memory)


__all__ = ["FittedParams"]
