"""`goodput advise --records FILE`: prompt-layout advice offline, from the same advisor the sidecar runs.

Each JSONL line is one request, in any of three shapes:
- a Mooncake trace line or a load-generator record from a trace replay: `hash_ids` (prefix-block
  ids; equal ids mean equal whole prefixes) with `input_length` / `input_tokens`, blocks of
  `--block-tokens` tokens;
- an OpenAI request body (`messages` or `prompt`), read here and reduced to keyed hashes at once;
  `prompt_tokens` / `usage_input_tokens` on the line calibrate characters to tokens;
- optional `model` and `tenant` fields group the lines (default: one group).
Output (text, or `--json FILE`) holds counts, offsets, lengths and estimates, never prompt text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from goodput_cli.errors import UsageError


def register(registry) -> None:
    p = registry.command("advise", "prompt-layout advice from request records or a trace (offline)", advise_cmd)
    p.add_argument("--records", type=Path, required=True,
                   help="JSONL: Mooncake trace lines, load-generator records (with hash_ids) or OpenAI request bodies")
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per hash_ids block (Mooncake: 512, default)")
    p.add_argument("--limit", type=int, default=None, help="analyse only the first N requests of the file")
    p.add_argument("--window", type=int, default=0,
                   help="recent prompts compared per model and tenant (default 0: every earlier request in the file)")
    p.add_argument("--max-span-tokens", type=float, default=64, help="longest volatile span looked for (default 64)")
    p.add_argument("--min-run-tokens", type=float, default=32,
                   help="shared tokens needed behind a span for it to count (default 32)")
    p.add_argument("--prefill-tokens-per-second", type=float, default=None,
                   help="the engine's prefill rate, to turn cacheable tokens into TTFT (default: tokens only)")
    p.add_argument("--json", type=Path, help="also write the report as JSON to this file")


def _lengths(n_blocks: int, input_tokens: int, block: int) -> list[int]:
    lengths = [block] * n_blocks
    if n_blocks and input_tokens:
        lengths[-1] = max(1, input_tokens - block * (n_blocks - 1))
    return lengths


def feed_line(advisor, doc: dict, block: int) -> bool:
    """Feed one record; False if it holds neither hash ids nor a prompt."""
    from sidecar.advice import chunk_ids, render

    model = doc.get("model") if isinstance(doc.get("model"), str) else "-"
    tenant = doc.get("tenant") if isinstance(doc.get("tenant"), str) else None
    hash_ids = doc.get("hash_ids")
    if isinstance(hash_ids, list) and hash_ids:
        tokens = doc.get("input_length", doc.get("input_tokens"))
        tokens = int(tokens) if isinstance(tokens, (int, float)) else 0
        advisor.observe(model, tenant, chunk_ids(hash_ids, _lengths(len(hash_ids), tokens, block)),
                        tokens_per_unit=1.0)
        return True
    chunks = render(doc)
    if chunks is None:
        return False
    tokens = doc.get("prompt_tokens", doc.get("usage_input_tokens"))
    advisor.observe(model, tenant, chunks, tokens if isinstance(tokens, int) else None)
    return True


def advise_cmd(args: argparse.Namespace) -> int:
    from sidecar.advisor import Advisor

    for flag, value, ok in (("--block-tokens", args.block_tokens, args.block_tokens >= 1),
                            ("--window", args.window, args.window >= 0),
                            ("--limit", args.limit, args.limit is None or args.limit >= 1),
                            ("--max-span-tokens", args.max_span_tokens, args.max_span_tokens > 0),
                            ("--min-run-tokens", args.min_run_tokens, args.min_run_tokens > 0)):
        if not ok:
            raise UsageError(f"{flag} {value}: must be {'>= 0 (0 = every earlier request)' if flag == '--window' else '> 0'}")
    if args.prefill_tokens_per_second is not None and args.prefill_tokens_per_second <= 0:
        raise UsageError("--prefill-tokens-per-second must be > 0")
    rate = 1.0 / args.prefill_tokens_per_second if args.prefill_tokens_per_second else None
    try:
        advisor = Advisor(args.window, args.max_span_tokens, args.min_run_tokens,
                          prefill_rate=(lambda _model: rate) if rate else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.records.is_file():
        raise UsageError(f"--records {args.records}: no such file")
    used = skipped = 0
    with open(args.records) as fh:
        for lineno, line in enumerate(fh, start=1):
            if args.limit is not None and used >= args.limit:
                break
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                raise UsageError(f"{args.records}:{lineno}: not JSON") from None
            if not isinstance(doc, dict):
                raise UsageError(f"{args.records}:{lineno}: expected a JSON object per line")
            if feed_line(advisor, doc, args.block_tokens):
                used += 1
            else:
                skipped += 1
    if used == 0:
        raise UsageError(f"{args.records}: no line has hash_ids or a prompt (messages / prompt); load-generator "
                         "records carry hash_ids only when the load replayed a trace (goodput load --trace)")
    report = advisor.report()
    report.update({"records": str(args.records), "requests": used, "skipped_lines": skipped})
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


def format_report(report: dict) -> str:
    lines = [f"goodput advise: {report['requests']} requests"
             + (f" ({report['skipped_lines']} lines without a prompt skipped)" if report.get("skipped_lines") else "")]
    for g in report["groups"]:
        lines.append(f"model {g['model']}, tenant {g['tenant']}: {g['requests']} requests, "
                     f"{g['prompt_tokens_per_request']:.0f} prompt tokens each")
        lines.append(f"  exact-prefix reusable: {g['prefix_reusable_share']:.1%} of prompt tokens")
        if g["span_offset_tokens"] is not None:
            lines.append(f"  volatile span: at token ~{g['span_offset_tokens']:.0f}, ~{g['span_length_tokens']:.0f} tokens "
                         f"long, in {g['span_share']:.1%} of requests")
            lines.append(f"  moved to the end: +{g['cacheable_tokens_per_request']:.0f} cacheable tokens per request "
                         f"(reusable share {g['reusable_share_if_moved']:.1%})")
            if g["ttft_saving_seconds"] is not None:
                lines.append(f"  estimated TTFT saving: {g['ttft_saving_seconds'] * 1e3:.0f} ms per request with the span")
        else:
            lines.append("  volatile span: none found (no advice)")
    return "\n".join(lines)
