"""A prior for the online service model (forecaster/service_learn.py) from a `goodput bench engine
--json` result: what `goodput forecaster run --prior` and `goodput demo`'s calibration seed it with."""

from __future__ import annotations

import numpy as np

from forecaster.service_model import ServiceModel


def model_from_bench(bench: dict, step_token_budget: int = 512, max_batch: int = 256,
                     kv_capacity_tokens: float = 1e12) -> ServiceModel:
    """A prior from `goodput bench engine --json`: step(b) fitted to its decode points, prefill
    from its prefill run, and the fixed TTFT overhead where the result states one
    (`ttft_overhead_s`, as `goodput demo`'s calibration does). With decode points at three or more
    batch sizes the step's concave part is fitted too (`step_curve`)."""
    points = [(float(d["batch"]), float(d["step_s"])) for d in bench.get("engine_decode", [])]
    if len(points) < 2 or "engine_prefill" not in bench:
        raise ValueError("a bench result needs engine_decode at two or more batch sizes and engine_prefill")
    a, c, d = step_curve([b for b, _ in points], [s for _, s in points])
    return ServiceModel(prefill_tokens_per_s=float(bench["engine_prefill"]["tokens_per_s"]),
                        decode_base_s=max(1e-4, a), decode_per_seq_s=c, decode_log_s=d,
                        kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch,
                        step_token_budget=step_token_budget, ttft_overhead_s=max(0.0, float(bench.get("ttft_overhead_s", 0.0))),
                        name="bench",
                        source=f"goodput bench engine ({bench.get('model', '?')})")


def step_curve(batches, steps) -> tuple[float, float, float]:
    """(a, c, d) of step(b) = a + c·b + d·ln(b), least squares with c, d >= 0, fitted to decode
    steps measured at `batches`. A CPU's step is concave in the batch (its products grow
    sublinearly in their rows): SmolLM2 in float32 on a 2-core AMD EPYC steps 43 ms at 1
    sequence, 101 at 8 and 172 at 32 (`goodput bench engine`), where the line through 1 and 8
    puts 32 at 300. With two batch sizes, the line; of the shapes whose terms come out
    non-negative (the line, the log alone, both), the closest, the simpler on a tie."""
    x = np.asarray(batches, dtype=float)
    y = np.asarray(steps, dtype=float)
    columns = {"a": np.ones_like(x), "c": x, "d": np.log(np.maximum(x, 1.0))}
    shapes = (("a", "c"), ("a", "d"), ("a", "c", "d")) if len(set(x.tolist())) >= 3 else (("a", "c"),)
    fits = []
    for shape in shapes:
        coef, *_ = np.linalg.lstsq(np.column_stack([columns[k] for k in shape]), y, rcond=None)
        values = dict(zip(shape, (float(v) for v in coef)))
        if values.get("c", 0.0) < 0 or values.get("d", 0.0) < 0:
            continue
        fitted = values["a"] + values.get("c", 0.0) * x + values.get("d", 0.0) * columns["d"]
        fits.append((float(np.sum((fitted - y) ** 2)), len(shape), values))
    if not fits:     # a step that falls with the batch: flat at the mean
        return float(np.mean(y)), 0.0, 0.0
    _, _, best = min(fits, key=lambda f: (f[0], f[1]))
    return best["a"], best.get("c", 0.0), best.get("d", 0.0)
