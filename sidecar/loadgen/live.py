"""A live progress line while load runs: sent, finished, errors and goodput so far.

Ctrl-C cancels the run; what was measured is kept and summarised.
"""

from __future__ import annotations

import asyncio
import signal
import time

from sidecar.loadgen.runner import LiveStats, run_load


async def run_with_progress(cfg, requests, prompts, label: str, quiet: bool = False):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    stats = LiveStats()
    task = asyncio.ensure_future(run_load(cfg, requests, prompts, stats))
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, task.cancel)
    except (NotImplementedError, RuntimeError):
        pass
    if quiet:
        result = await task
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False) as progress:
            bar = progress.add_task(label, total=len(requests), info="")
            while not task.done():
                progress.update(bar, completed=stats.finished,
                                info=f"sent {stats.sent} good {stats.good} err {stats.errors} shed {stats.shed} "
                                     f"goodput {stats.goodput(time.perf_counter()):.2f} req/s")
                await asyncio.wait([task], timeout=0.5)
            progress.update(bar, completed=stats.finished)
        result = task.result()
    try:
        loop.remove_signal_handler(signal.SIGINT)
    except (NotImplementedError, RuntimeError):
        pass
    return result
