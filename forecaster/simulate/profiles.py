"""Per-replica service profiles: how fast one replica prefills and decodes, and what it holds.

A profile is the simulator's whole knowledge of the serving engine. It comes from a measurement
(`goodput bench engine --json` or a `goodput sweep` result written as JSON with the fields below)
or from one of the built-in profiles, whose sources are stated next to their numbers.

Each profile is an instance of forecaster.service_model.ServiceModel, the model the forecaster
plans with, plus the SLO its scenario is scored against. The built-in profiles' decode step is
linear in the batch, step(b) = decode_base_s + decode_per_seq_s * b, fitted to two measured points:
what a memory-bound decoder does (every step reads all weights once; each sequence adds its KV
reads and a little compute). A bench result with three or more batch sizes also gets the step's
concave part (decode_log_s · ln b), as a CPU's step needs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from forecaster.service_model import ServiceModel, Slo
from forecaster.service_prior import decode_points, model_from_bench


@dataclass(frozen=True, kw_only=True)
class ServiceProfile(ServiceModel):
    """A simulated replica: a ServiceModel (forecaster/service_model.py, the one model the
    forecaster plans with) and the SLO its scenario is scored against."""

    slo: Slo

    def to_dict(self) -> dict:
        return asdict(self)


# The bundled engine serving SmolLM2-135M on this machine's 2 CPU cores. Figures from DESIGN.md's
# measurements on these machines: a decode step of 75 ms at batch 1 and 327 ms at batch 32 (so
# 66.9 ms + 8.13 ms per sequence), prefill 214-350 tokens/s (280 taken). KV: SmolLM2 has 30 layers x 3 KV heads x 64 dims x 2 (K,V) x 4 bytes = 46 KB a token in float32; 1.5 GB of
# cache holds about 32k tokens. SLO: a CPU replica takes ~7 s to prefill a 2k-token prompt, so the
# objective is 10 s to first token and 0.5 s a token after it.
CPU_SMOLLM2 = ServiceProfile(
    name="cpu-smollm2",
    prefill_tokens_per_s=280.0,
    decode_base_s=0.0669,
    decode_per_seq_s=0.00813,
    kv_capacity_tokens=32_768,
    max_batch=32,
    step_token_budget=512,
    slo=Slo(ttft_s=10.0, tpot_s=0.5),
    source="DESIGN.md CPU figures (AMD EPYC, 2 cores): decode 75 ms @ b=1, 327 ms @ b=32; prefill 214-350 tok/s",
)

# Llama-3-70B in FP8 on 4 x H100 80GB (tensor parallel 4), served by vLLM/TensorRT-LLM. These are
# approximate, from published figures, not measured here:
# - TensorRT-LLM performance table (NVIDIA/TensorRT-LLM release/0.5.0 docs/source/performance.md,
#   H100 FP8): LLaMA 70B TP4 batch 64, 128 in / 128 out: 3,317 output tok/s, i.e. ~19 ms a step at
#   batch 64; 2048 in / 128 out: 843 tok/s, which leaves ~4.6 s for 131k prompt tokens (~28k tok/s).
# - NVIDIA NIM benchmarks, Llama-3.3-70B FP8 on 2 x H100 (TP2): TTFT 407 ms for 5,000 input tokens
#   at concurrency 1 (~12k tok/s on half the GPUs), ITL 18.6 ms at concurrency 1, 38.8 ms at 25.
# Taken (rounded to the cautious side, as vLLM serving rather than a static-batch benchmark):
# prefill 20k tok/s, step = 20 ms + 0.3 ms x batch (39 ms at 64). KV: 4 x 80 GB - 70 GB of weights,
# 90 % for cache = 225 GB at 320 KB a token (80 layers x 8 KV heads x 128 x 2 x 2 bytes) ~ 700k
# tokens; 600k taken. max_num_seqs 256 is vLLM's default; max_num_batched_tokens 2048 is the
# latency-tuned setting (vLLM's default 8192 makes every step that carries a chunk ~0.4 s, which alone
# breaks a 200 ms TPOT whenever a prompt backlog exists). SLO: MLPerf Inference's Llama-2-70B server scenario (TTFT 2 s, TPOT 200 ms).
H100_70B = ServiceProfile(
    name="h100-70b",
    prefill_tokens_per_s=20_000.0,
    decode_base_s=0.020,
    decode_per_seq_s=0.0003,
    kv_capacity_tokens=600_000,
    max_batch=256,
    step_token_budget=2048,
    slo=Slo(ttft_s=2.0, tpot_s=0.2),
    source="approximate: TensorRT-LLM perf table (LLaMA 70B TP4 FP8 H100), NVIDIA NIM Llama-3.3-70B H100 benchmarks; SLO from MLPerf Llama-2-70B server",
)

BUILTIN = {p.name: p for p in (CPU_SMOLLM2, H100_70B)}


def profile_from_bench(bench: dict, name: str = "bench", base: ServiceProfile = CPU_SMOLLM2) -> ServiceProfile:
    """A profile from a `goodput bench engine --json` result, read as the forecaster reads it for
    its prior (forecaster.service_prior.model_from_bench: the step's line, its concave part from
    three batch sizes on, prefill from its prefill run); KV, batch limits and SLO from `base`."""
    try:
        model = model_from_bench(bench, step_token_budget=base.step_token_budget, max_batch=base.max_batch,
                                 kv_capacity_tokens=base.kv_capacity_tokens)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bench result {name!r}: {exc}") from None
    points = decode_points(bench)
    values = {f.name: getattr(model, f.name) for f in fields(ServiceModel)}
    values.update(name=name, source=f"goodput bench engine result ({bench.get('model', '?')}): decode {points}, "
                                    f"prefill {model.prefill_tokens_per_s:.0f} tok/s; KV, batch and SLO from {base.name}")
    return ServiceProfile(**values, slo=base.slo)


def load_profile(name_or_path: str) -> ServiceProfile:
    """A built-in profile by name, a `goodput bench engine --json` result, or a JSON file with
    ServiceProfile's fields (slo as {ttft_s, tpot_s})."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"profile {name_or_path!r} is neither a built-in ({', '.join(sorted(BUILTIN))}) nor a JSON file")
    data = json.loads(path.read_text())
    if "engine_decode" in data and "engine_prefill" in data:
        return profile_from_bench(data, name=path.stem)
    try:
        slo = Slo(**data.pop("slo"))
        return ServiceProfile(slo=slo, **data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"profile file {path}: {exc}; expected the fields of {sorted(ServiceProfile.__dataclass_fields__)}") from exc
