"""`--dtype auto`: bfloat16 where this hardware makes it faster, float32 elsewhere.

On CUDA bfloat16 runs on the tensor cores and halves the bytes a decode step reads, so `auto`
takes it whenever the GPU supports it. On a CPU the answer depends on the chip and on torch's
kernels, not on a brand: without bf16 instructions (AVX512-BF16, AMX) torch emulates bfloat16 and
is many times slower; with them it can be faster or slower depending on the shape (on an AMD EPYC
with AVX512-BF16 and torch 2.13, 2-3x faster at 32 rows but slower at 1 row, where oneDNN's
bf16 matrix-vector product reads memory at half the rate of MKL's float32 one). So a CPU that
reports the instructions is confirmed by a short timed comparison of the model's own projections
in the three shapes the engine spends its time in (batch-1 decode over weights larger than the
last-level cache, a 32-row decode batch, a 256-row prefill chunk), and bfloat16 is chosen only if
it wins all three: `auto` must never be slower than float32.

A timed comparison near its bar reads either way from one start to the next (on an EPYC with
AVX512-BF16 the batch-1 shape reads 0.9-1.2x), and an engine whose speed doubles or halves between
restarts is worse than either choice. So the measured decision is kept, per machine, torch,
thread count and model shapes, in $GOODPUT_CACHE/dtype-auto.json (default ~/.cache/goodput), and
later starts reuse it; a measurement taken while the machine was busy (1-minute load average above
half its CPUs) decides that start only and is not kept. GOODPUT_DTYPE_REMEASURE=1 measures again
(and keeps the new answer).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")
REQUESTABLE = ("auto", *DTYPES)   # what --dtype takes wherever an engine is started
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
# bfloat16 must be at least this much faster at every shape; a shared machine's noise alone
# should not flip the choice.
MIN_SPEEDUP = 1.1


@dataclass(frozen=True)
class DtypeChoice:
    """What the engine computes in, and why (logged at start and exported on /metrics)."""

    dtype: str
    requested: str
    reason: str       # a short label value: requested, cuda_bf16, cuda_no_bf16, cpu_bf16_faster, ...
    detail: str       # one line for the log
    # shape name -> {"float32": seconds, "bfloat16": seconds} when a measurement decided it.
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "requested": self.requested, "reason": self.reason, "detail": self.detail,
                "timings": self.timings}


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str] | None:
    """The bf16 instruction flags this CPU reports, or None where /proc/cpuinfo is unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return [f for f in BF16_CPU_FLAGS if f in flags]


def last_level_cache_bytes() -> int:
    """Largest CPU cache size sysfs reports (0 if none): sizes the bandwidth probe past it."""
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            t = f.read_text().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
            best = max(best, int(t.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best


def layer_shapes(cfg) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's projections as the engine fuses them (ModelConfig)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)]


def time_projections(cfg, llc_bytes: int | None = None, repeats: int = 3, device: str = "cpu") -> dict:
    """Best-of-`repeats` seconds per dtype of the engine's own projections (engine.model.Proj, so
    float32 takes its transposed/packed path and bfloat16 F.linear) in three shapes:
    decode_batch_1 over as many copies of the model's layer weights as exceed 4x the last-level
    cache (at least 128 MB of float32, at most the model's layers: weights stream from memory as
    in a real step), decode_batch_32 and prefill_chunk_256 over one layer (compute-bound).
    The two dtypes alternate, so a burst of load elsewhere hits both alike."""
    import torch

    from engine.model import Proj, packed_gemm_available

    shapes = layer_shapes(cfg)
    layer_bytes = 4 * sum(n * k for n, k in shapes)
    want = max(128 * 2**20, 4 * (last_level_cache_bytes() if llc_bytes is None else llc_bytes))
    num_layers = max(1, min(cfg.num_layers, -(-want // layer_bytes)))
    packed = packed_gemm_available(device)
    layers, inputs = {}, {}
    for name in ("float32", "bfloat16"):
        dt = getattr(torch, name)
        layers[name] = [[Proj(torch.full((n, k), 0.01, dtype=dt, device=device), packed) for n, k in shapes]
                        for _ in range(num_layers)]
        inputs[name] = {rows: {k: torch.full((rows, k), 0.01, dtype=dt, device=device) for _, k in shapes}
                        for rows in (1, 32, 256)}
    plan = {"decode_batch_1": (1, num_layers), "decode_batch_32": (32, 1), "prefill_chunk_256": (256, 1)}
    out: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for shape, (rows, n_layers) in plan.items():
            best = {name: float("inf") for name in layers}
            for r in range(repeats + 1):
                for name in layers:
                    xs = inputs[name][rows]
                    if device != "cpu":
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    for layer in layers[name][:n_layers]:
                        for proj in layer:
                            proj(xs[proj.weight.shape[0 if proj.transposed else 1]])
                    if device != "cpu":
                        torch.cuda.synchronize()
                    if r:  # the first pass selects kernels and faults pages in
                        best[name] = min(best[name], time.perf_counter() - t)
            out[shape] = best
    return out


def bf16_wins(timings: dict[str, dict[str, float]], min_speedup: float = MIN_SPEEDUP) -> bool:
    """True if bfloat16 beat float32 by `min_speedup` at every measured shape."""
    return bool(timings) and all(t["float32"] >= min_speedup * t["bfloat16"] for t in timings.values())


def choose_dtype(requested: str, device: str, model_cfg=None, measure=None, flags=None) -> DtypeChoice:
    """Resolve --dtype for a model (a ModelConfig: the probe uses its layer shapes). `measure`
    (model_cfg -> timings) and `flags` default to the real machine's."""
    if requested not in ("auto", *DTYPES):
        raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {requested!r}")
    if requested != "auto":
        return DtypeChoice(requested, requested, "requested", f"{requested} as requested (--dtype {requested})")
    import torch

    kind = str(device).split(":")[0]
    if kind == "cuda":
        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", "auto", "cuda_bf16", "bfloat16: CUDA device with bfloat16 support")
        return DtypeChoice("float32", "auto", "cuda_no_bf16", "float32: this CUDA device lacks bfloat16")
    if kind != "cpu":
        return DtypeChoice("float32", "auto", "other_device", f"float32: no bfloat16 rule for device {device!r}")
    flags = cpu_bf16_flags() if flags is None else flags
    if flags is not None and not flags:
        return DtypeChoice("float32", "auto", "cpu_no_bf16_isa",
                           "float32: the CPU reports neither amx_bf16 nor avx512_bf16 (bfloat16 would be emulated)")
    if model_cfg is None and measure is None:
        raise ValueError("--dtype auto on a CPU needs the model's shapes to measure")
    if measure is None:
        cached = _cached_choice(model_cfg, flags)
        if cached is not None:
            return cached
    timings = (measure or time_projections)(model_cfg)
    choice = _decide(timings, flags)
    if measure is None:
        _keep_choice(model_cfg, flags, choice)
    return choice


def _decide(timings: dict, flags) -> DtypeChoice:
    ratios = ", ".join(f"{name} {t['float32'] / t['bfloat16']:.2f}x" for name, t in timings.items())
    have = "+".join(flags) if flags else "flags unknown"
    if bf16_wins(timings):
        return DtypeChoice("bfloat16", "auto", "cpu_bf16_faster",
                           f"bfloat16: CPU with {have}, bfloat16 projections measured faster at every shape ({ratios} float32 time / bfloat16 time)", timings)
    return DtypeChoice("float32", "auto", "cpu_bf16_slower",
                       f"float32: CPU with {have}, but bfloat16 projections were not {MIN_SPEEDUP}x faster at every "
                       f"shape ({ratios} float32 time / bfloat16 time)", timings)


def _cache_path() -> Path:
    from engine.weights.fetch import cache_dir

    return cache_dir() / "dtype-auto.json"


def _cache_key(model_cfg, flags) -> str:
    """What the decision depends on: the CPU, torch and its threads, the model's projection shapes."""
    import torch

    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    parts = [cpu, ",".join(flags or []), torch.__version__, str(torch.get_num_threads()),
             str(layer_shapes(model_cfg)), str(model_cfg.num_layers), str(last_level_cache_bytes())]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _read_cache() -> dict:
    try:
        doc = json.loads(_cache_path().read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}   # absent or damaged: measure again


def _cached_choice(model_cfg, flags) -> DtypeChoice | None:
    if os.environ.get("GOODPUT_DTYPE_REMEASURE", "") not in ("", "0"):
        return None
    entry = _read_cache().get(_cache_key(model_cfg, flags))
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES or not isinstance(entry.get("timings"), dict):
        return None
    choice = _decide(entry["timings"], flags)
    when = entry.get("measured_at", "earlier")
    return DtypeChoice(choice.dtype, "auto", choice.reason,
                       f"{choice.detail}; measured {when}, kept in {_cache_path()} (GOODPUT_DTYPE_REMEASURE=1 "
                       f"measures again)", choice.timings)


def _keep_choice(model_cfg, flags, choice: DtypeChoice) -> None:
    """Keep a quiet machine's measured decision for later starts; a busy one's decides this start only."""
    if not choice.timings or os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        return
    path = _cache_path()
    doc = _read_cache()
    doc[_cache_key(model_cfg, flags)] = {"dtype": choice.dtype, "timings": choice.timings,
                                         "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass   # a read-only home: every start measures, as before
