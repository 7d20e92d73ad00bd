"""Where weights come from: `smollm2`, `tiny`, a GGUF file or an HF folder -> one HF-style folder."""

from __future__ import annotations

from pathlib import Path


def resolve_model(model: str, progress=print) -> tuple[Path, str]:
    """(folder holding config.json + safetensors + tokenizer.json, default served name)."""
    from engine.weights import fetch

    if model == "smollm2":
        return fetch.smollm2_folder(progress), "smollm2"
    if model == "tiny":
        from engine.weights.tiny import tiny_folder

        return tiny_folder(progress), "tiny"
    if model == "smollm2-shaped":
        from engine.weights.tiny import shaped_folder

        return shaped_folder(progress), "smollm2-shaped"
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--model {model!r}: no such file or folder (use smollm2, tiny, smollm2-shaped, a .gguf file or an HF folder)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"--model {model!r}: a file must be a .gguf; a Hugging Face model is a folder")
        return _converted_gguf(path, progress), path.stem
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {model!r}: the folder has no config.json")
    return path, path.name


def _converted_gguf(path: Path, progress) -> Path:
    import hashlib

    from engine.weights.fetch import cache_dir
    from engine.weights.gguf import GGUFFile, convert_gguf_to_folder

    GGUFFile(path)  # fail on a bad file before announcing a conversion
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    folder = cache_dir() / "models" / f"{path.stem}-{key}"
    if not (folder / "model.safetensors").is_file():
        progress(f"converting {path.name} to float32 in {folder} (once)")
        convert_gguf_to_folder(path, folder)
    return folder
