"""`goodput bench engine`: the engine against its physical floors and against transformers.

One run measures, side by side: memory read bandwidth and float32 matmul rate (the floors they
imply for a decode step and a prefill), engine decode tokens/s at batch 1/8/32, engine prefill of
a 1,024-token prompt, and transformers' generate at batch 1 and 8 on the same weights. Medians
of repeats; every ratio printed; where a target is missed, a per-op profile says where time went.
"""

from __future__ import annotations

import json
import os
import statistics
import time

from goodput_cli.errors import UsageError

DECODE_BATCHES = (1, 8, 32)
HF_BATCHES = (1, 8)
PROMPT_LEN = 64          # decode runs start from prompts this long
PREFILL_LEN = 1024
STALL_BUDGETS = (None, 512, 128)   # unchunked, the serve default, small chunks


class MachineRates:
    """Memory read bandwidth (sum over 512 MB) and float32 matmul rate (2048^3), sampled between
    the other measurements. Other processes share this machine, so rates swing; the floors use
    the best rate seen in the run (the machine can do at least that), which makes them strict."""

    def __init__(self):
        import torch

        self.big = torch.ones(128 * 2**20)  # 512 MB of float32
        self.a, self.b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        self.big.sum()
        self.a @ self.b
        self.reads: list[float] = []
        self.matmuls: list[float] = []

    def sample(self, repeats: int = 3) -> None:
        for _ in range(repeats):
            t = time.perf_counter()
            self.big.sum()
            self.reads.append(self.big.numel() * 4 / (time.perf_counter() - t) / 1e9)
            t = time.perf_counter()
            self.a @ self.b
            self.matmuls.append(2 * 2048**3 / (time.perf_counter() - t) / 1e9)

    def result(self) -> dict:
        return {"memory_read_gb_s": max(self.reads), "matmul_gflop_s": max(self.matmuls),
                "memory_read_gb_s_median": statistics.median(self.reads),
                "matmul_gflop_s_median": statistics.median(self.matmuls), "samples": len(self.reads)}


def _engine(folder, max_seqs=64):
    from engine.config import EngineConfig
    from engine.core import LLMEngine

    cfg = EngineConfig(max_model_len=2048, max_num_seqs=max_seqs, max_num_batched_tokens=2048,
                       kv_cache_memory=1024 * 2**20, num_threads=os.cpu_count() or 1)
    return LLMEngine.from_folder(folder, cfg)


def _prompts(engine, batch: int, length: int) -> list[list[int]]:
    """Distinct prompts (no prefix-cache sharing between them) of exactly `length` tokens."""
    base = engine.tokenizer.encode("The history of lighthouses begins with fires lit on hilltops to guide ships. " * 60)
    return [[(t + 7919 * i) % 40000 + 100 for t in base[:length]] for i in range(batch)]


def engine_decode(engine, batch: int, steps: int) -> dict:
    """Median time of pure decode steps with `batch` running sequences."""
    from engine.request import SamplingParams

    engine.kv.pool.reset_prefix_cache()
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for i, p in enumerate(_prompts(engine, batch, PROMPT_LEN)):
        engine.add_request(f"dec{batch}-{i}", p, params, detokenize=False)
    times = []
    while engine.has_work():
        decoding = all(r.num_computed_tokens >= len(r.prompt_token_ids) for r in engine.scheduler.running) \
            and len(engine.scheduler.running) == batch and not engine.scheduler.waiting
        t = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    return {"batch": batch, "step_s": step, "tokens_per_s": batch / step, "steps_measured": len(times)}


def engine_prefill(engine, repeats: int) -> dict:
    from engine.request import SamplingParams

    times = []
    prompt = _prompts(engine, 1, PREFILL_LEN)[0]
    for i in range(repeats + 1):
        engine.kv.pool.reset_prefix_cache()  # a cache hit would skip the work we time
        engine.add_request(f"pre-{i}", prompt, SamplingParams(max_tokens=1, temperature=0), detokenize=False)
        t = time.perf_counter()
        while engine.has_work():
            engine.step()
        if i:  # the first run warms up
            times.append(time.perf_counter() - t)
    s = statistics.median(times)
    return {"tokens": PREFILL_LEN, "seconds": s, "tokens_per_s": PREFILL_LEN / s}


def load_hf(folder):
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()


def hf_decode(model, engine, batch: int, new_tokens: int) -> dict:
    """transformers generate: per-token decode time = (t(1 + n tokens) - t(1 token)) / n."""
    import torch

    ids = torch.tensor(_prompts(engine, batch, PROMPT_LEN))
    mask = torch.ones_like(ids)

    def run(n):
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t

    run(2)
    t1 = statistics.median([run(1) for _ in range(2)])
    tn = run(1 + new_tokens)
    step = (tn - t1) / new_tokens
    return {"batch": batch, "step_s": step, "tokens_per_s": batch / step}


def prefill_stall(engine, budget: int | None) -> dict:
    """Four sequences decoding when a 1,024-token prompt arrives: the longest gap between their
    tokens (a step) while it is prefilled, and its time to first token. budget=None: unchunked."""
    from engine.request import SamplingParams

    sched = engine.scheduler
    saved = sched.chunked, sched.max_num_batched_tokens
    sched.chunked = budget is not None
    sched.max_num_batched_tokens = budget or max(saved[1], PREFILL_LEN + 8)
    try:
        engine.kv.pool.reset_prefix_cache()
        prompts = _prompts(engine, 5, PREFILL_LEN)
        for i in range(4):
            engine.add_request(f"stall-{budget}-{i}", prompts[i][:PROMPT_LEN],
                               SamplingParams(max_tokens=64, temperature=0, ignore_eos=True), detokenize=False)
        for _ in range(3):
            engine.step()
        long_id = f"stall-{budget}-long"
        engine.add_request(long_id, prompts[4], SamplingParams(max_tokens=1, temperature=0), detokenize=False)
        t0, steps, ttft = time.perf_counter(), [], None
        while ttft is None:
            t = time.perf_counter()
            outs = engine.step()
            steps.append(time.perf_counter() - t)
            if any(o.request_id == long_id for o in outs):
                ttft = time.perf_counter() - t0
        for i in range(4):
            engine.abort(f"stall-{budget}-{i}")
    finally:
        sched.chunked, sched.max_num_batched_tokens = saved
    return {"budget": budget, "max_decode_gap_s": max(steps), "long_prompt_ttft_s": ttft, "steps": len(steps)}


def profile_ops(engine, batch: int, prompt_len: int, steps: int) -> list[dict]:
    """Self CPU time per op over a few engine steps (decode when prompt_len is short)."""
    from torch.profiler import ProfilerActivity, profile

    from engine.request import SamplingParams

    engine.kv.pool.reset_prefix_cache()
    params = SamplingParams(max_tokens=steps + 3, temperature=0, ignore_eos=True)
    for i, p in enumerate(_prompts(engine, batch, prompt_len)):
        engine.add_request(f"prof-{batch}-{prompt_len}-{i}", p, params, detokenize=False)
    if prompt_len <= PROMPT_LEN:
        engine.step()
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_work():
        engine.step()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    return [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1000 / steps, "share": e.self_cpu_time_total / total,
             "calls_per_step": e.count / steps} for e in rows[:8]]


def run_bench(args) -> int:
    from rich.console import Console
    from rich.progress import Progress

    import torch

    from engine.weights import resolve_model

    console = Console(stderr=True)
    torch.set_num_threads(os.cpu_count() or 1)
    quick = bool(getattr(args, "quick", False))
    started = time.perf_counter()
    try:
        folder, name = resolve_model(args.model, lambda m: console.print(m))
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(f"cannot load model {args.model!r}: {exc}") from None
    res: dict = {"model": name, "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                 "quick": quick}
    decode_steps, hf_tokens, rounds = (8, 4, 1) if quick else (32, 16, 3)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("machine rates", total=2 + rounds * 7)
        machine = MachineRates()
        machine.sample()
        progress.update(task, advance=1, description="loading the engine and transformers")
        engine = _engine(folder)
        hf_model = load_hf(folder)
        params = engine.runner.model.num_parameters()
        res["model_params"] = params
        res["weight_bytes"] = params * 4
        # Other processes share this machine and its speed swings by 2x within a minute. So the
        # engine and transformers are measured in alternation, `rounds` times, and each result
        # is the best round (the least disturbed), like the floors, which use the best rates.
        runs: dict[str, list[dict]] = {}
        for r in range(rounds):
            for b in DECODE_BATCHES:
                progress.update(task, advance=1, description=f"round {r + 1}/{rounds}: engine decode, batch {b}")
                runs.setdefault(f"engine_b{b}", []).append(engine_decode(engine, b, decode_steps))
                if b in HF_BATCHES:
                    progress.update(task, advance=1, description=f"round {r + 1}/{rounds}: transformers, batch {b}")
                    runs.setdefault(f"hf_b{b}", []).append(hf_decode(hf_model, engine, b, hf_tokens))
                machine.sample(3)
            progress.update(task, advance=1, description=f"round {r + 1}/{rounds}: engine prefill, 1024 tokens")
            runs.setdefault("prefill", []).append(engine_prefill(engine, 1))
            machine.sample(3)
            progress.update(task, description=f"round {r + 1}/{rounds}: decode stalls during a long prefill")
            for b in STALL_BUDGETS:
                runs.setdefault(f"stall_{b}", []).append(prefill_stall(engine, b))
        del hf_model

        def best(key: str, field: str = "step_s") -> dict:
            out = dict(min(runs[key], key=lambda x: x[field]))
            out["rounds_" + field] = [x[field] for x in runs[key]]
            return out

        res["rounds"] = rounds
        res["engine_decode"] = [best(f"engine_b{b}") for b in DECODE_BATCHES]
        res["transformers_decode"] = [best(f"hf_b{b}") for b in HF_BATCHES]
        res["engine_prefill"] = best("prefill", "seconds")
        res["prefill_stall"] = [best(f"stall_{b}", "max_decode_gap_s") for b in STALL_BUDGETS]
        progress.update(task, description="profiles")
        res["machine"] = machine.result()
        del machine
        bw, mm = res["machine"]["memory_read_gb_s"] * 1e9, res["machine"]["matmul_gflop_s"] * 1e9
        res["floors"] = {"decode_step_s": params * 4 / bw, "prefill_s_per_token": 2 * params / mm}
        res["ratios"] = ratios(res)
        res["profiles"] = {}
        missed = res["ratios"]["missed"]
        if any(k.startswith("decode") for k in missed):
            for b in DECODE_BATCHES:
                res["profiles"][f"decode_batch_{b}"] = profile_ops(engine, b, PROMPT_LEN, 3)
        if any(k.startswith("prefill") for k in missed):
            res["profiles"]["prefill_1024"] = profile_ops(engine, 1, PREFILL_LEN, 1)
    res["wall_s"] = time.perf_counter() - started
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(res, f, indent=1)
    print(render(res))
    return 0


def ratios(res: dict) -> dict:
    """Every ratio the issue asks for; 'missed' lists targets not reached (1.5x floor, 2x transformers)."""
    floor_step, floor_tok = res["floors"]["decode_step_s"], res["floors"]["prefill_s_per_token"]
    out: dict = {"missed": []}
    mm = res["machine"]["matmul_gflop_s"] * 1e9
    for d in res["engine_decode"]:
        r = d["step_s"] / floor_step
        out[f"decode_b{d['batch']}_over_floor"] = r
        # At large batch a step also has to do batch x 2 x params FLOPs; on a CPU that, not the
        # weight read, is the binding floor (32 x 269 MFLOP = 8.6 GFLOP a step for SmolLM2).
        roof = max(floor_step, d["batch"] * 2 * res["model_params"] / mm)
        out[f"decode_b{d['batch']}_roofline_floor_s"] = roof
        out[f"decode_b{d['batch']}_over_roofline"] = d["step_s"] / roof
        if d["batch"] in (1, 32) and r > 1.5:
            out["missed"].append(f"decode_b{d['batch']}_within_1.5x_floor")
    p = res["engine_prefill"]
    out["prefill_over_floor"] = (p["seconds"] / p["tokens"]) / floor_tok
    if out["prefill_over_floor"] > 1.5:
        out["missed"].append("prefill_within_1.5x_floor")
    by_batch = {d["batch"]: d for d in res["engine_decode"]}
    for h in res["transformers_decode"]:
        r = by_batch[h["batch"]]["tokens_per_s"] / h["tokens_per_s"]
        out[f"decode_b{h['batch']}_over_transformers"] = r
        if r < 2:
            out["missed"].append(f"decode_b{h['batch']}_2x_transformers")
    return out


def render(res: dict) -> str:
    m, f, r = res["machine"], res["floors"], res["ratios"]
    lines = [f"goodput bench engine: {res['model']} ({res['model_params'] / 1e6:.1f} M params, "
             f"{res['weight_bytes'] / 1e6:.0f} MB fp32), {res['threads']} threads, OMP_WAIT_POLICY={res['omp_wait_policy']}",
             f"machine: memory read {m['memory_read_gb_s']:.1f} GB/s, fp32 matmul {m['matmul_gflop_s']:.1f} GFLOP/s "
             f"(best of {m['samples']} samples through the run; medians {m['memory_read_gb_s_median']:.1f} GB/s, "
             f"{m['matmul_gflop_s_median']:.1f} GFLOP/s); each result below is the best of {res['rounds']} "
             f"alternating rounds",
             f"floors: decode step {f['decode_step_s'] * 1e3:.1f} ms (weights / bandwidth), "
             f"prefill {f['prefill_s_per_token'] * 1e3:.2f} ms/token (2 x params FLOPs / matmul rate)", "",
             f"{'measurement':<34}{'result':>16}{'vs floor':>11}{'vs transformers':>17}{'vs roofline':>13}"]
    hf = {h["batch"]: h for h in res["transformers_decode"]}
    for d in res["engine_decode"]:
        b = d["batch"]
        vs_hf = f"{r[f'decode_b{b}_over_transformers']:.2f}x" if b in hf else "-"
        lines.append(f"{'engine decode, batch ' + str(b):<34}{d['tokens_per_s']:>9.1f} tok/s"
                     f"{r[f'decode_b{b}_over_floor']:>10.2f}x{vs_hf:>17}{r[f'decode_b{b}_over_roofline']:>12.2f}x"
                     f"   ({d['step_s'] * 1e3:.1f} ms/step; roofline floor {r[f'decode_b{b}_roofline_floor_s'] * 1e3:.0f} ms)")
    p = res["engine_prefill"]
    lines.append(f"{'engine prefill, 1024 tokens':<34}{p['tokens_per_s']:>9.1f} tok/s{r['prefill_over_floor']:>10.2f}x{'-':>17}"
                 f"   ({p['seconds'] * 1e3:.0f} ms)")
    for h in res["transformers_decode"]:
        lines.append(f"{'transformers generate, batch ' + str(h['batch']):<34}{h['tokens_per_s']:>9.1f} tok/s"
                     f"{h['step_s'] / f['decode_step_s']:>10.2f}x{'1.00x':>17}   ({h['step_s'] * 1e3:.1f} ms/step)")
    for st in res["prefill_stall"]:
        how = "unchunked" if st["budget"] is None else f"chunks of {st['budget']}"
        lines.append(f"1024-token prompt arriving while 4 sequences decode, {how}: their longest token gap "
                     f"{st['max_decode_gap_s'] * 1e3:.0f} ms, its TTFT {st['long_prompt_ttft_s'] * 1e3:.0f} ms")
    lines.append("")
    lines.append("vs floor: measured time / floor (1.00x = at the floor); vs transformers: engine tokens/s / transformers tokens/s;")
    lines.append("vs roofline: time / max(weight bytes / bandwidth, batch x 2 x params / matmul rate)")
    lines.append("targets: decode b1/b32 and prefill within 1.5x of floor; decode >= 2x transformers at the same batch")
    lines.append("missed: " + (", ".join(r["missed"]) if r["missed"] else "none"))
    for name, rows in res["profiles"].items():
        lines.append(f"profile {name} (self CPU time per step, top ops):")
        for row in rows:
            lines.append(f"  {row['op']:<52}{row['ms_per_step']:>9.2f} ms {row['share'] * 100:>5.1f}%  {row['calls_per_step']:>6.0f} calls")
    lines.append(f"wall time {res['wall_s']:.0f} s")
    return "\n".join(lines)
