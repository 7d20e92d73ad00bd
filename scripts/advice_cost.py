"""What the prompt-layout advice costs a request, in a hot loop: `python scripts/advice_cost.py
[--prompt-tokens 2048]`.

The bodies are the ones `goodput bench sidecar` sends in its `requests2k` scenario
(sidecar/bench/client.py `request_bodies`: a shared system prompt and a user message of its own, 64
variants). Each step the sidecar runs on such a body is timed alone, best of 5 repeats: the body's
JSON, rendering the prompt into chunks (sidecar/advice.py `render`), and the window's analysis
(`PromptWindow.analyse_and_add`, the prefix and bigram tables over the last 256 prompts; the 64
bodies repeat, so after the first pass each prompt is found whole in the window, as in the
benchmark, which cycles the same bodies). A hot
loop is a floor: inside the sidecar each request runs these once, cold (on the Xeon host of
2026-12-07 the three came to 96-107 µs here in three runs, and a 2,048-token prompt added 260 µs a request
in `goodput bench sidecar`). It is a timing: run it alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.advice import PromptWindow, render  # noqa: E402
from sidecar.bench.client import request_bodies  # noqa: E402


def per_call_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=2048,
                   help="prompt size of the bodies (default 2048; 0: the one-word prompt of the other scenarios)")
    p.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = p.parse_args(argv)
    if args.prompt_tokens < 0 or args.number <= 0:
        p.error("--prompt-tokens must be >= 0 and --number positive")
    bodies = request_bodies(1, args.prompt_tokens)
    docs = [json.loads(b) for b in bodies]
    chunks = [render(d) for d in docs]
    window = PromptWindow(256)
    k = itertools.count()

    def loads():
        json.loads(bodies[next(k) % len(bodies)])

    def rendering():
        render(docs[next(k) % len(docs)])

    def analysis():
        window.analyse_and_add(chunks[next(k) % len(chunks)], 64, 32)

    print(f"body {len(bodies[0]):,} bytes, {len(chunks[0].hashes)} chunks a prompt; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, fn in (("json.loads", loads), ("advice.render", rendering),
                      ("PromptWindow.analyse_and_add", analysis)):
        print(f"{label:30s} {per_call_us(fn, args.number):8.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
