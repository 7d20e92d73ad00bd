"""`goodput bench engine`: the engine against its physical floors and against transformers.

One run measures, side by side: memory bandwidth and the matmul rate in the run's dtype (the
floors they imply for a decode step and a prefill; engine/bench_rates.py), engine decode tokens/s
at batch 1/8/32 (or --batches), engine prefill of a 1,024-token prompt (or --prefill-lens), and
transformers' generate at batch 1 and 8 on the same weights in the same dtype and device. Best of
alternating rounds; every ratio printed (engine/bench_report.py); where a target is missed, a
per-op profile says where time went. `--dtype both` runs float32 and bfloat16 one after the other
and prints them side by side.
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


def _engine(folder, device: str, dtype: str, batches, prefill_lens, decode_steps: int):
    """An engine sized for the run: every batch fits at once, a whole prefill fits in one step."""
    from engine.config import EngineConfig
    from engine.core import LLMEngine
    from engine.weights.hf import load_config

    model = load_config(folder)
    longest = max(max(prefill_lens), PREFILL_LEN)
    ctx = min(model.max_position_embeddings, max(2048, longest + 16))
    tokens = max(max(batches) * (PROMPT_LEN + decode_steps + 16), longest + 64, 5 * PREFILL_LEN + 256)
    elt = 4 if dtype == "float32" else 2
    kv = max(1024 * 2**20, int(1.25 * tokens * model.kv_bytes_per_token(elt)))
    cfg = EngineConfig(max_model_len=ctx, max_num_seqs=max(64, max(batches)), max_num_batched_tokens=max(2048, longest),
                       kv_cache_memory=kv, num_threads=os.cpu_count() or 1, device=device, dtype=dtype)
    return LLMEngine.from_folder(folder, cfg)


def _prompts(engine, batch: int, length: int) -> list[list[int]]:
    """Distinct prompts (no prefix-cache sharing between them) of exactly `length` tokens."""
    base = engine.tokenizer.encode("The history of lighthouses begins with fires lit on hilltops to guide ships. " * 60)
    base = (base * (-(-length // len(base))))[:length]
    return [[(t + 7919 * i) % 40000 + 100 for t in base] for i in range(batch)]


def engine_decode(engine, batch: int, steps: int, lengths: list[int] | None = None) -> dict:
    """Median time of pure decode steps with `batch` running sequences, each from a prompt of
    PROMPT_LEN tokens or of lengths[i] (scripts/decode_mixed_lengths.py: contexts of mixed lengths)."""
    from engine.request import SamplingParams

    lengths = [PROMPT_LEN] * batch if lengths is None else list(lengths)
    if len(lengths) != batch or min(lengths) < 1:
        raise ValueError(f"need {batch} prompt lengths >= 1, got {lengths}")
    engine.kv.pool.reset_prefix_cache()
    # The first admitted decode while the rest prefill (a step takes max_num_batched_tokens of
    # prompt), so each gets that many more tokens: `steps` steps with the whole batch decoding.
    prefill_steps = -(-sum(lengths) // engine.scheduler.max_num_batched_tokens)
    params = SamplingParams(max_tokens=steps + 2 + prefill_steps, temperature=0, ignore_eos=True)
    for i, (p, n) in enumerate(zip(_prompts(engine, batch, max(lengths)), lengths)):
        engine.add_request(f"dec{batch}-{i}", p[:n], params, detokenize=False)
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


def engine_prefill(engine, repeats: int, length: int = PREFILL_LEN) -> dict:
    from engine.request import SamplingParams

    times = []
    # One token is generated, so a prompt as long as the context is one token shorter.
    length = min(length, engine.max_model_len - 1)
    prompt = _prompts(engine, 1, length)[0]
    for i in range(repeats + 1):
        engine.kv.pool.reset_prefix_cache()  # a cache hit would skip the work we time
        engine.add_request(f"pre-{i}", prompt, SamplingParams(max_tokens=1, temperature=0), detokenize=False)
        t = time.perf_counter()
        while engine.has_work():
            engine.step()
        if i:  # the first run warms up
            times.append(time.perf_counter() - t)
    s = statistics.median(times)
    return {"tokens": length, "seconds": s, "tokens_per_s": length / s}


def load_hf(folder, dtype: str = "float32", device: str = "cpu"):
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()


def hf_decode(model, engine, batch: int, new_tokens: int) -> dict:
    """transformers generate: per-token decode time = (t(1 + n tokens) - t(1 token)) / n."""
    import torch

    ids = torch.tensor(_prompts(engine, batch, PROMPT_LEN), device=model.device)
    mask = torch.ones_like(ids)

    def run(n):
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            out.cpu()  # waits for a GPU to finish
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
    """Self time per op over a few engine steps (decode when prompt_len is short): CPU time on a
    CPU, GPU kernel time on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    from engine.request import SamplingParams

    engine.kv.pool.reset_prefix_cache()
    params = SamplingParams(max_tokens=steps + 3, temperature=0, ignore_eos=True)
    for i, p in enumerate(_prompts(engine, batch, prompt_len)):
        engine.add_request(f"prof-{batch}-{prompt_len}-{i}", p, params, detokenize=False)
    if prompt_len <= PROMPT_LEN:
        engine.step()
        engine.step()
    cuda = engine.runner.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_work():
        engine.step()

    def own(e):
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    rows = sorted(prof.key_averages(), key=own, reverse=True)
    total = sum(own(e) for e in rows) or 1
    return [{"op": e.key, "ms_per_step": own(e) / 1000 / steps, "share": own(e) / total,
             "calls_per_step": e.count / steps} for e in rows[:8]]


def _int_list(text: str | None, default: tuple[int, ...], flag: str) -> tuple[int, ...]:
    if not text:
        return default
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} must be whole numbers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} needs at least one value >= 1, got {text!r}")
    return values


def run_bench(args) -> int:
    from rich.console import Console

    import torch

    from engine.bench_report import render, render_side_by_side
    from engine.cli import pick_device
    from engine.dtype import choose_dtype
    from engine.weights import resolve_model
    from engine.weights.hf import load_config

    console = Console(stderr=True)
    torch.set_num_threads(os.cpu_count() or 1)
    device = pick_device(getattr(args, "device", None))
    batches = _int_list(getattr(args, "batches", None), DECODE_BATCHES, "--batches")
    prefill_lens = _int_list(getattr(args, "prefill_lens", None), (PREFILL_LEN,), "--prefill-lens")
    try:
        folder, name = resolve_model(args.model, lambda m: console.print(m))
        model_cfg = load_config(folder)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(f"cannot load model {args.model!r}: {exc}") from None
    requested = getattr(args, "dtype", "auto") or "auto"
    if requested == "both":
        choices = [choose_dtype(d, device) for d in ("float32", "bfloat16")]
    else:
        choices = [choose_dtype(requested, device, model_cfg)]
    for c in choices:
        console.print(f"dtype {c.detail}")
    results = [bench_one(folder, name, device, c, batches, prefill_lens, bool(getattr(args, "quick", False)), console)
               for c in choices]
    doc = results[0] if len(results) == 1 else {"model": name, "device": device,
                                                 "dtypes": [r["dtype"] for r in results], "runs": results}
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(doc, f, indent=1)
    for r in results:
        print(render(r))
        print()
    if len(results) > 1:
        print(render_side_by_side(results))
    return 0


def bench_one(folder, name: str, device: str, choice, batches, prefill_lens, quick: bool, console) -> dict:
    """One dtype's full run: rates, engine and transformers in alternating rounds, floors, ratios."""
    from rich.progress import Progress

    import torch

    from engine.bench_rates import MachineRates
    from engine.bench_report import ratios

    started = time.perf_counter()
    dtype = choice.dtype
    res: dict = {"model": name, "device": device, "dtype": dtype, "dtype_choice": choice.to_json(),
                 "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "quick": quick}
    decode_steps, hf_tokens, rounds = (8, 4, 1) if quick else (32, 16, 3)
    hf_batches = tuple(b for b in HF_BATCHES if b in batches)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{dtype}: machine rates", total=2 + rounds * (len(batches) + len(hf_batches) + 2))
        machine = MachineRates(dtype, device)
        machine.sample()
        progress.update(task, advance=1, description=f"{dtype}: loading the engine and transformers")
        engine = _engine(folder, device, dtype, batches, prefill_lens, decode_steps)
        hf_model = load_hf(folder, dtype, device)
        params = engine.runner.model.num_parameters()
        res["model_params"] = params
        res["weight_bytes"] = params * torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        # Other processes share this machine and its speed swings by 2x within a minute. So the
        # engine and transformers are measured in alternation, `rounds` times, and each result
        # is the best round (the least disturbed), like the floors, which use the best rates.
        runs: dict[str, list[dict]] = {}
        for r in range(rounds):
            for b in batches:
                progress.update(task, advance=1, description=f"{dtype} round {r + 1}/{rounds}: engine decode, batch {b}")
                runs.setdefault(f"engine_b{b}", []).append(engine_decode(engine, b, decode_steps))
                if b in hf_batches:
                    progress.update(task, advance=1, description=f"{dtype} round {r + 1}/{rounds}: transformers, batch {b}")
                    runs.setdefault(f"hf_b{b}", []).append(hf_decode(hf_model, engine, b, hf_tokens))
                machine.sample(3)
            for n in prefill_lens:
                progress.update(task, description=f"{dtype} round {r + 1}/{rounds}: engine prefill, {n} tokens")
                runs.setdefault(f"prefill_{n}", []).append(engine_prefill(engine, 1, n))
            progress.update(task, advance=1)
            machine.sample(3)
            progress.update(task, advance=1, description=f"{dtype} round {r + 1}/{rounds}: decode stalls during a long prefill")
            for b in STALL_BUDGETS:
                runs.setdefault(f"stall_{b}", []).append(prefill_stall(engine, b))
        del hf_model

        def best(key: str, field: str = "step_s") -> dict:
            out = dict(min(runs[key], key=lambda x: x[field]))
            out["rounds_" + field] = [x[field] for x in runs[key]]
            return out

        res["rounds"] = rounds
        res["engine_decode"] = [best(f"engine_b{b}") for b in batches]
        res["transformers_decode"] = [best(f"hf_b{b}") for b in hf_batches]
        res["engine_prefills"] = [best(f"prefill_{n}", "seconds") for n in prefill_lens]
        res["engine_prefill"] = res["engine_prefills"][0]
        res["prefill_stall"] = [best(f"stall_{b}", "max_decode_gap_s") for b in STALL_BUDGETS]
        progress.update(task, description=f"{dtype}: profiles")
        res["machine"] = machine.result()
        del machine
        bw, mm = res["machine"]["memory_read_gb_s"] * 1e9, res["machine"]["matmul_gflop_s"] * 1e9
        # A decode step reads every weight once: half the bytes in bfloat16 as in float32.
        res["floors"] = {"decode_step_s": res["weight_bytes"] / bw, "prefill_s_per_token": 2 * params / mm}
        res["ratios"] = ratios(res)
        res["profiles"] = {}
        missed = res["ratios"]["missed"]
        if any(k.startswith("decode") for k in missed):
            for b in batches:
                res["profiles"][f"decode_batch_{b}"] = profile_ops(engine, b, PROMPT_LEN, 3)
        if any(k.startswith("prefill") for k in missed):
            res["profiles"][f"prefill_{PREFILL_LEN}"] = profile_ops(engine, 1, PREFILL_LEN, 1)
    res["wall_s"] = time.perf_counter() - started
    return res
