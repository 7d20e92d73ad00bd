"""A prior for the online service model (forecaster/service_learn.py) from a `goodput bench engine
--json` result: what `goodput forecaster run --prior` and `goodput demo`'s calibration seed it with."""

from __future__ import annotations

import numpy as np

from forecaster.robust_line import nonnegative_solve
from forecaster.service_model import ServiceModel


def model_from_bench(bench: dict, step_token_budget: int = 512, max_batch: int = 256,
                     kv_capacity_tokens: float = 1e12) -> ServiceModel:
    """A prior from `goodput bench engine --json`: step(b) fitted to its decode points, prefill
    from its prefill run, and the fixed TTFT overhead where the result states one
    (`ttft_overhead_s`, as `goodput demo`'s calibration does). With decode points at three or more
    batch sizes the step's concave part is fitted too (`step_curve`)."""
    points = decode_points(bench)
    if len(points) < 2 or "engine_prefill" not in bench:
        raise ValueError("a bench result needs engine_decode at two or more batch sizes and engine_prefill")
    a, c, d = step_curve([b for b, _ in points], [s for _, s in points])
    return ServiceModel(prefill_tokens_per_s=float(bench["engine_prefill"]["tokens_per_s"]),
                        decode_base_s=a, decode_per_seq_s=c, decode_log_s=d,
                        kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch,
                        step_token_budget=step_token_budget, ttft_overhead_s=max(0.0, float(bench.get("ttft_overhead_s", 0.0))),
                        name="bench",
                        source=f"goodput bench engine ({bench.get('model', '?')})")


def decode_points(bench: dict) -> list[tuple[float, float]]:
    """(batch, step seconds) of a bench result's decode runs: the curve's points, and the batches
    a prior's evidence was measured at (OnlineServiceModel's prior_batches)."""
    return [(float(d["batch"]), float(d["step_s"])) for d in bench.get("engine_decode", [])]


def step_curve(batches, steps) -> tuple[float, float, float]:
    """(a, c, d) of step(b) = a + c·b + d·ln(b), least squares with a >= 0.1 ms and c, d >= 0
    (robust_line.nonnegative_solve, the learner's own solve), fitted to decode steps measured at
    `batches`. A CPU's step is concave in the batch (its products grow sublinearly in their rows):
    SmolLM2 in float32 on a 2-core AMD EPYC steps 43 ms at 1 sequence, 101 at 8 and 172 at 32
    (`goodput bench engine`), where the line through 1 and 8 puts 32 at 300. With two batch sizes,
    the line; a step that falls with the batch, flat at the mean."""
    x = np.asarray(batches, dtype=float)
    y = np.asarray(steps, dtype=float)
    concave = np.log(np.maximum(x, 1.0)) if len(set(x.tolist())) >= 3 else np.zeros_like(x)
    design = np.column_stack([np.ones_like(x), x, concave])
    a, c, d = (float(v) for v in nonnegative_solve(design.T @ design, design.T @ y, 1e-4))
    return a, c, d
