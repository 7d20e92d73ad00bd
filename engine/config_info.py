"""Info gauges (value 1, facts in labels) for the engine's /metrics: its cache config under vLLM's
own name, and the dtype it computes in with why (`--dtype auto` decides at start, so a scrape is
where a dashboard or a person learns which one a replica runs). Kept apart from metrics.py: these
are written once at start, never by the engine loop."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

# vLLM's CacheConfig.metrics_info() labels that the bundled engine has a value for.
CACHE_LABELS = ("block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks")
DTYPE_LABELS = ("model_name", "dtype", "requested", "reason", "device")


def export_config_info(registry: CollectorRegistry, model_name: str, engine) -> None:
    cache = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", CACHE_LABELS,
                  registry=registry)
    # vLLM writes Python values as strings ("True", "16"); so do we, so one parser reads both.
    cache.labels(block_size=str(engine.cfg.block_size), cache_dtype=engine.dtype,
                 enable_prefix_caching=str(engine.cfg.enable_prefix_caching),
                 num_gpu_blocks=str(engine.num_blocks)).set(1)
    choice = engine.dtype_choice
    info = Gauge("goodput:engine_dtype_info", "The dtype the engine computes in (1); reason says why "
                 "(requested, cuda_bf16, cpu_bf16_faster, cpu_bf16_slower, cpu_no_bf16_isa, ...).", DTYPE_LABELS,
                 registry=registry)
    info.labels(model_name=model_name, dtype=choice.dtype, requested=choice.requested, reason=choice.reason,
                device=str(engine.cfg.device)).set(1)
