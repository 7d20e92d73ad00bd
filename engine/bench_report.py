"""Ratios and the printed table of `goodput bench engine` (engine/bench.py measures)."""

from __future__ import annotations

# (what, batch or None for prefill, against, at most): the targets. A CPU: decode batch 1
# and 32 and prefill within 1.5x of their floors. A GPU: decode batch 1 within 2x of the HBM floor,
# batch 128 within 2x of the roofline, prefill within 2x of the compute floor.
CPU_TARGETS = (("decode", 1, "floor", 1.5), ("decode", 32, "floor", 1.5), ("prefill", None, "floor", 1.5))
GPU_TARGETS = (("decode", 1, "floor", 2.0), ("decode", 128, "roofline", 2.0), ("prefill", None, "floor", 2.0))


def ratios(res: dict) -> dict:
    """Every ratio the issue asks for; 'missed' lists targets not reached (floors, 2x transformers)."""
    floor_step, floor_tok = res["floors"]["decode_step_s"], res["floors"]["prefill_s_per_token"]
    out: dict = {"missed": []}
    mm = res["machine"]["matmul_gflop_s"] * 1e9
    for d in res["engine_decode"]:
        out[f"decode_b{d['batch']}_over_floor"] = d["step_s"] / floor_step
        # At large batch a step also has to do batch x 2 x params FLOPs; on a CPU that, not the
        # weight read, is the binding floor (32 x 269 MFLOP = 8.6 GFLOP a step for SmolLM2).
        roof = max(floor_step, d["batch"] * 2 * res["model_params"] / mm)
        out[f"decode_b{d['batch']}_roofline_floor_s"] = roof
        out[f"decode_b{d['batch']}_over_roofline"] = d["step_s"] / roof
    for p in res.get("engine_prefills", [res["engine_prefill"]]):
        out[f"prefill_{p['tokens']}_over_floor"] = (p["seconds"] / p["tokens"]) / floor_tok
    p = res["engine_prefill"]
    out["prefill_over_floor"] = (p["seconds"] / p["tokens"]) / floor_tok
    targets = GPU_TARGETS if str(res.get("device", "cpu")).startswith("cuda") else CPU_TARGETS
    for what, batch, against, limit in targets:
        if what == "prefill":
            if out["prefill_over_floor"] > limit:
                out["missed"].append(f"prefill_within_{limit:g}x_floor")
        elif f"decode_b{batch}_over_{against}" in out and out[f"decode_b{batch}_over_{against}"] > limit:
            out["missed"].append(f"decode_b{batch}_within_{limit:g}x_{against}")
    by_batch = {d["batch"]: d for d in res["engine_decode"]}
    for h in res["transformers_decode"]:
        r = by_batch[h["batch"]]["tokens_per_s"] / h["tokens_per_s"]
        out[f"decode_b{h['batch']}_over_transformers"] = r
        if r < 2:
            out["missed"].append(f"decode_b{h['batch']}_2x_transformers")
    return out


def render(res: dict) -> str:
    m, f, r = res["machine"], res["floors"], res["ratios"]
    dt = res.get("dtype", "float32")
    bw_word = "memory copy" if res.get("device", "cpu").startswith("cuda") else "memory read"
    lines = [f"goodput bench engine: {res['model']} ({res['model_params'] / 1e6:.1f} M params, "
             f"{res['weight_bytes'] / 1e6:.0f} MB {dt}) on {res.get('device', 'cpu')}, {res['threads']} threads, "
             f"OMP_WAIT_POLICY={res['omp_wait_policy']}",
             f"dtype: {res['dtype_choice']['detail']}" if "dtype_choice" in res else f"dtype: {dt}",
             f"machine: {bw_word} {m['memory_read_gb_s']:.1f} GB/s, {dt} matmul {m['matmul_gflop_s']:.1f} GFLOP/s "
             f"(best of {m['samples']} samples through the run; medians {m['memory_read_gb_s_median']:.1f} GB/s, "
             f"{m['matmul_gflop_s_median']:.1f} GFLOP/s); each result below is the best of {res['rounds']} "
             f"alternating rounds",
             f"floors: decode step {f['decode_step_s'] * 1e3:.2f} ms (weights / bandwidth), "
             f"prefill {f['prefill_s_per_token'] * 1e3:.3f} ms/token (2 x params FLOPs / matmul rate)", "",
             f"{'measurement':<34}{'result':>16}{'vs floor':>11}{'vs transformers':>17}{'vs roofline':>13}"]
    hf = {h["batch"]: h for h in res["transformers_decode"]}
    for d in res["engine_decode"]:
        b = d["batch"]
        vs_hf = f"{r[f'decode_b{b}_over_transformers']:.2f}x" if b in hf else "-"
        lines.append(f"{'engine decode, batch ' + str(b):<34}{d['tokens_per_s']:>9.1f} tok/s"
                     f"{r[f'decode_b{b}_over_floor']:>10.2f}x{vs_hf:>17}{r[f'decode_b{b}_over_roofline']:>12.2f}x"
                     f"   ({d['step_s'] * 1e3:.1f} ms/step; roofline floor {r[f'decode_b{b}_roofline_floor_s'] * 1e3:.1f} ms)")
    for p in res.get("engine_prefills", [res["engine_prefill"]]):
        label, key = f"engine prefill, {p['tokens']} tokens", f"prefill_{p['tokens']}_over_floor"
        lines.append(f"{label:<34}{p['tokens_per_s']:>9.1f} tok/s{r[key]:>10.2f}x"
                     f"{'-':>17}   ({p['seconds'] * 1e3:.0f} ms)")
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
    if res.get("device", "cpu").startswith("cuda"):
        lines.append("targets: decode b1 within 2x floor, b128 within 2x roofline, prefill within 2x floor; decode >= 2x transformers")
    else:
        lines.append("targets: decode b1/b32 and prefill within 1.5x of floor; decode >= 2x transformers at the same batch")
    lines.append("missed: " + (", ".join(r["missed"]) if r["missed"] else "none"))
    for name, rows in res["profiles"].items():
        lines.append(f"profile {name} (self time per step, top ops):")
        for row in rows:
            lines.append(f"  {row['op']:<52}{row['ms_per_step']:>9.2f} ms {row['share'] * 100:>5.1f}%  {row['calls_per_step']:>6.0f} calls")
    lines.append(f"wall time {res['wall_s']:.0f} s")
    return "\n".join(lines)


def render_side_by_side(results: list[dict]) -> str:
    """One row per measurement, one column per dtype, and the last dtype's speed-up over the first."""
    names = [r["dtype"] for r in results]
    head = f"{'side by side (tokens/s unless noted)':<40}" + "".join(f"{n:>14}" for n in names) + f"{names[-1] + ' / ' + names[0]:>22}"
    lines = [head]

    def row(label: str, values: list[float], fmt: str = "{:>14.1f}") -> None:
        ratio = values[-1] / values[0] if values[0] else float("nan")
        lines.append(f"{label:<40}" + "".join(fmt.format(v) for v in values) + f"{ratio:>21.2f}x")

    row("matmul rate, GFLOP/s", [r["machine"]["matmul_gflop_s"] for r in results])
    row("decode floor, ms/step (lower is better)", [r["floors"]["decode_step_s"] * 1e3 for r in results], "{:>14.2f}")
    for i, d in enumerate(results[0]["engine_decode"]):
        row(f"engine decode, batch {d['batch']}", [r["engine_decode"][i]["tokens_per_s"] for r in results])
    for i, p in enumerate(results[0]["engine_prefills"]):
        row(f"engine prefill, {p['tokens']} tokens", [r["engine_prefills"][i]["tokens_per_s"] for r in results])
    for i, h in enumerate(results[0]["transformers_decode"]):
        row(f"transformers generate, batch {h['batch']}", [r["transformers_decode"][i]["tokens_per_s"] for r in results])
    return "\n".join(lines)
