"""`goodput engine serve` and `goodput bench engine`. Heavy imports stay inside the functions."""

from __future__ import annotations

import argparse
import sys
import time

from engine.dtype import REQUESTABLE
from goodput_cli.errors import UsageError


def register(registry) -> None:
    p = registry.command("engine serve", "serve the bundled engine (OpenAI-compatible)", serve)
    p.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, smollm2-shaped (random weights in SmolLM2's shapes), a .gguf file or an HF folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", action="append", default=None,
                   help="name(s) clients use in 'model' (repeatable; default: the model's short name)")
    add_engine_args(p)
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")

    b = registry.command("bench engine", "engine performance against its floors and transformers", bench)
    b.add_argument("--model", default="smollm2", help="model to measure (default smollm2)")
    b.add_argument("--json", dest="json_path", default=None, help="also write the results as JSON to this file")
    b.add_argument("--quick", action="store_true", help="fewer repeats and tokens (a smoke run, not the numbers)")
    b.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    b.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "both"),
                   help="auto (default: what `engine serve` would pick here), float32, bfloat16, or both side by side")
    b.add_argument("--batches", default=None,
                   help="decode batch sizes, comma-separated (default 1,8,32; e.g. 1,8,32,128 on a GPU)")
    b.add_argument("--prefill-lens", default=None,
                   help="prefill prompt lengths, comma-separated (default 1024; e.g. 1024,8192 on a GPU)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--kv-cache-memory", default="512MiB", help="KV cache budget, e.g. 512MiB, 2GiB (default 512MiB)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks to allocate (overrides --kv-cache-memory)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512,
                   help="token budget of one step: bounds how long a prefill chunk stalls running decodes (default 512)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests in one step (default 64)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    p.add_argument("--no-chunked-prefill", action="store_true", help="run each prompt's prefill whole in one step")
    p.add_argument("--no-prefix-caching", action="store_true", help="switch automatic prefix caching off")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", default="auto", choices=REQUESTABLE,
                   help="auto (default): bfloat16 on CUDA and on a CPU where a short timed comparison at start finds "
                        "it faster at every shape, else float32")
    p.add_argument("--seed", type=int, default=0)


def pick_device(requested: str | None) -> str:
    import torch

    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here; use --device cpu")
    return device


def engine_config(args):
    from engine.config import EngineConfig, parse_bytes

    device = pick_device(args.device)
    dtype = args.dtype or "auto"
    try:
        return EngineConfig(block_size=args.block_size, kv_cache_memory=parse_bytes(args.kv_cache_memory),
                            num_blocks=args.num_blocks, max_num_batched_tokens=args.max_num_batched_tokens,
                            max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                            enable_chunked_prefill=not args.no_chunked_prefill,
                            enable_prefix_caching=not args.no_prefix_caching, device=device, dtype=dtype, seed=args.seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def load_engine(model: str, cfg, progress=None):
    """(engine, default served name); every expected failure becomes a one-line UsageError."""
    from engine.core import LLMEngine
    from engine.weights import resolve_model
    from engine.weights.fetch import FetchError

    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        folder, name = resolve_model(model, progress)
        return LLMEngine.from_folder(folder, cfg), name, folder
    except (FileNotFoundError, FetchError, ValueError, KeyError) as exc:
        msg = str(exc) if not isinstance(exc, KeyError) else f"the model config lacks {exc}"
        raise UsageError(f"cannot load model {model!r}: {msg}") from None


def serve(args) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from engine.config_info import export_config_info
    from engine.engine_loop import EngineLoop
    from engine.metrics import EngineMetrics
    from engine.server import make_app

    cfg = engine_config(args)
    _check_port(args.host, args.port)  # fail in one line before spending seconds on loading
    t0 = time.monotonic()
    engine, name, folder = load_engine(args.model, cfg)
    names = args.served_model_name or [name]
    registry = CollectorRegistry()
    loop = EngineLoop(engine, EngineMetrics(registry, names[0]))
    export_config_info(registry, names[0], engine)
    loop.start()
    app = make_app(loop, names, registry, {"root": str(folder)})
    print(f"goodput engine: {names[0]} loaded in {time.monotonic() - t0:.1f}s ({engine.num_blocks} KV blocks of "
          f"{cfg.block_size}, context {engine.max_model_len}, {cfg.device} {engine.dtype}); "
          f"serving http://{args.host}:{args.port}/v1\n"
          f"goodput engine: dtype {engine.dtype_choice.detail}", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    finally:
        loop.stop()
    return 0


def _check_port(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or --host") from None


def bench(args) -> int:
    from engine.bench import run_bench

    return run_bench(args)
