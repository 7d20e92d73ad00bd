"""Decode steps when the sequences of a step have different context lengths, with the engine's
grouping by length (engine/attention.py) and without it (one batch padded to the longest, as the
engine did until 2026-12-07), side by side in one process.

    python scripts/decode_mixed_lengths.py [--model smollm2] [--batches 8,32,64] [--steps 8] [--draws 8]

Rows: every sequence 70 tokens; one of them 540 tokens; lengths drawn from the demo's Mooncake mix
(its prompts plus up to 30 generated tokens; the mean over --draws draws, since how often a long
prompt is in the batch is the point). In-process LLMEngine with the serve defaults (token budget
512, 64 sequences), float32, all cores; the median step of each, timed by `goodput bench
engine`'s own decode timer (engine/bench.py engine_decode); prints the load average before and
after.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--batches", default="8,32,64")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--draws", type=int, default=8, help="draws of the demo's mix per batch (default 8)")
    args = p.parse_args()
    from engine import attention
    from engine.bench import engine_decode
    from engine.config import EngineConfig
    from engine.core import LLMEngine
    from engine.weights import resolve_model
    from goodput_cli.demo import replayed_trace

    folder, _ = resolve_model(args.model)
    engine = LLMEngine.from_folder(folder, EngineConfig(max_model_len=2048, num_threads=os.cpu_count() or 1,
                                                        device="cpu", dtype="float32"))
    mix = [r.input_tokens for r in replayed_trace()[0]]
    grouped = attention.GROUP_COST_SLOTS

    def step_ms(lengths: list[int], group_cost: int) -> float:
        attention.GROUP_COST_SLOTS = group_cost      # out of reach: one padded batch, as before the grouping
        return engine_decode(engine, len(lengths), args.steps, lengths)["step_s"] * 1000

    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; median decode step, ms")
    print(f"{'batch':>5}  {'lengths':<34} {'one padded batch':>17} {'grouped':>9} {'ratio':>6}")
    for b in (int(x) for x in args.batches.split(",")):
        rows = [("every sequence 70 tokens", [[70] * b]), ("one of them 540 tokens", [[70] * (b - 1) + [540]])]
        rng = random.Random(b)
        rows.append((f"the demo's mix, {args.draws} draws (mean)",
                     [[min(540, rng.choice(mix) + rng.randint(0, 30)) for _ in range(b)] for _ in range(args.draws)]))
        for label, draws in rows:
            one = statistics.mean(step_ms(d, 10**12) for d in draws)
            split = statistics.mean(step_ms(d, grouped) for d in draws)
            print(f"{b:>5}  {label:<34} {one:>17.1f} {split:>9.1f} {split / one:>6.2f}", flush=True)
    attention.GROUP_COST_SLOTS = grouped
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
