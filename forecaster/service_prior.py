"""A prior for the online service model (forecaster/service_learn.py) from a `goodput bench engine
--json` result: what `goodput forecaster run --prior` and `goodput demo`'s calibration seed it with."""

from __future__ import annotations

import numpy as np

from forecaster.service_model import ServiceModel


def model_from_bench(bench: dict, step_token_budget: int = 512, max_batch: int = 256,
                     kv_capacity_tokens: float = 1e12) -> ServiceModel:
    """A prior from `goodput bench engine --json`: step(b) fitted to its decode points, prefill
    from its prefill run, and the fixed TTFT overhead where the result states one
    (`ttft_overhead_s`, as `goodput demo`'s calibration does)."""
    points = [(float(d["batch"]), float(d["step_s"])) for d in bench.get("engine_decode", [])]
    if len(points) < 2 or "engine_prefill" not in bench:
        raise ValueError("a bench result needs engine_decode at two or more batch sizes and engine_prefill")
    x = np.array([b for b, _ in points])
    y = np.array([s for _, s in points])
    c, a = np.polyfit(x, y, 1)
    return ServiceModel(prefill_tokens_per_s=float(bench["engine_prefill"]["tokens_per_s"]),
                        decode_base_s=max(1e-4, float(a)), decode_per_seq_s=max(0.0, float(c)),
                        kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch,
                        step_token_budget=step_token_budget, ttft_overhead_s=max(0.0, float(bench.get("ttft_overhead_s", 0.0))),
                        name="bench",
                        source=f"goodput bench engine ({bench.get('model', '?')})")
