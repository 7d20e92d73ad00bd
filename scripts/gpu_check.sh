#!/usr/bin/env bash
# The engine on a GPU, in one command (under 8 minutes on an H200), results in $OUT:
#   1. the engine's tests with the engine and its transformers reference on the GPU
#   2. greedy tokens and logits against transformers on the same GPU, float32 and bfloat16
#   3. goodput bench engine --dtype both, floors from this GPU (device copy, bf16/fp32 matmul),
#      decode batch 1/8/32/128, prefill 1,024 and 8,192 tokens
#   4. a short goodput sweep through the sidecar: does throughput still rise past the goodput knee?
#
# Where it runs: the device image's own python3 and torch; nothing is downloaded. Missing Python
# packages come as wheels in .gpu_check/wheels and SmolLM2's tokenizer in .gpu_check/cache, both
# made here by scripts/gpu_check_prepare.sh; carry the folder: run(carry=[".gpu_check"],
# command="bash scripts/gpu_check.sh"). The real SmolLM2 GGUF is 94 MiB, over the 64 MiB a call
# carries, so the default model is `smollm2-shaped` (seeded random weights in SmolLM2-135M's
# shapes with its tokenizer: the same speed); GPU_CHECK_MODEL=path/to/model.gguf or an HF folder
# uses real weights where they are on the machine.
#
# Knobs: GPU_CHECK_DEVICE (cuda, or cpu: the same steps at small sizes, to test this script on a
# machine without a GPU; default cuda when torch sees one), GPU_CHECK_MODEL, GPU_CHECK_PYTHON
# (default python3), GPU_CHECK_WHEELS=0 (use the interpreter's own packages, not the carried
# CPython 3.12 wheels), GPU_CHECK_SWEEP_RATES, GPU_CHECK_SLO_TPOT.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
PY=${GPU_CHECK_PYTHON:-python3}
START=$(date +%s)
export PYTHONUNBUFFERED=1

if [ "${GPU_CHECK_WHEELS:-1}" = 1 ] && compgen -G ".gpu_check/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
        .gpu_check/wheels/*.whl || { echo "installing the carried wheels failed"; exit 2; }
    export PYTHONPATH="$ROOT:/tmp/gpu_check_site"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
# The carried cache holds SmolLM2's tokenizer (the tiny and shaped models are built from it).
if [ -z "${GOODPUT_CACHE:-}" ] && [ -d .gpu_check/cache ]; then export GOODPUT_CACHE="$ROOT/.gpu_check/cache"; fi

DEVICE=${GPU_CHECK_DEVICE:-$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)}
if [ "$DEVICE" = cuda ]; then
    MODEL=${GPU_CHECK_MODEL:-smollm2-shaped}
    BENCH_ARGS=(--batches 1,8,32,128 --prefill-lens 1024,8192)
    TESTS=(tests/engine -m "not slow")
    RATES=${GPU_CHECK_SWEEP_RATES:-2,8,16,32,64}; DURATION=10; TPOT=${GPU_CHECK_SLO_TPOT:-0.015}
    SEQS=256; KV=8GiB
else
    # Small sizes: this path exists to test the script itself, in a minute or two.
    MODEL=${GPU_CHECK_MODEL:-tiny}
    BENCH_ARGS=(--batches 1,8 --prefill-lens 256 --quick)
    TESTS=(tests/engine/test_dtype.py tests/engine/test_model.py -m "not slow" -k "dtype or logits or float32 or bfloat16")
    RATES=${GPU_CHECK_SWEEP_RATES:-1,4,16}; DURATION=4; TPOT=${GPU_CHECK_SLO_TPOT:-0.05}
    SEQS=64; KV=256MiB
fi
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
say "gpu_check: device $DEVICE, model $MODEL, python $PY, $(date -u +%FT%TZ)"

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PY" - <<'EOF'
import sys, importlib
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
for m in ("transformers", "fastapi", "uvicorn", "pydantic", "safetensors", "tokenizers", "prometheus_client",
          "opentelemetry.sdk", "aiohttp", "httpx", "openai", "pytest", "gguf", "engine.server", "sidecar.app"):
    try:
        mod = importlib.import_module(m)
        print(f"  {m:20} ok {getattr(mod, '__version__', '')}")
    except Exception as exc:
        print(f"  {m:20} MISSING ({exc})")
EOF
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step() {  # step NAME TIMEOUT_S CMD...: runs, logs, records the exit status in the summary
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s)
    timeout "$limit" "$@"
    local rc=$?
    say "step $name: exit $rc in $(( $(date +%s) - t0 )) s (total $(elapsed) s)"
    return 0
}

# 1. The engine's tests on the device.
export GOODPUT_TEST_DEVICE=$DEVICE
step tests 150 "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" >"$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log" | tee -a "$SUMMARY"

# 2. Parity against transformers on the same device, both dtypes; tiny and the bench model.
: >"$OUT/parity.txt"
PARITY_MODELS=(tiny)
[ "$MODEL" != tiny ] && PARITY_MODELS+=("$MODEL")
for m in "${PARITY_MODELS[@]}"; do
    for dt in float32 bfloat16; do
        step "parity-$m-$dt" 90 "$PY" -m engine.parity --model "$m" --device "$DEVICE" --dtype "$dt" --tokens 32 \
            --json "/tmp/gpu_check_parity_${m//\//_}_$dt.json" 2>/dev/null | sed "s|^|$m: |" | tee -a "$OUT/parity.txt"
    done
done
"$PY" - "$OUT/parity.json" /tmp/gpu_check_parity_*.json <<'EOF'
import json, sys
json.dump({p: json.load(open(p)) for p in sys.argv[2:]}, open(sys.argv[1], "w"), indent=1)
EOF
cat "$OUT/parity.txt" >>"$SUMMARY"

# 3. The benchmark, both dtypes side by side, floors measured on this device.
step bench 300 "$PY" -m goodput_cli bench engine --model "$MODEL" --device "$DEVICE" --dtype both "${BENCH_ARGS[@]}" \
    --json "$OUT/bench.json" >"$OUT/bench.txt" 2>"/tmp/gpu_check_bench.err"
tail -n 5 /tmp/gpu_check_bench.err >>"$OUT/bench.txt"
sed -n '/^side by side/,$p' "$OUT/bench.txt" | tee -a "$SUMMARY"
grep -E "^(machine|floors|missed):" "$OUT/bench.txt" | tee -a "$SUMMARY"

# 4. Sweep through the sidecar. Budget: whatever is left of 8 minutes, at most 150 s.
LEFT=$(( 470 - $(elapsed) ))
if [ "$LEFT" -gt 40 ]; then
    SWEEP_LIMIT=$(( LEFT < 150 ? LEFT : 150 ))
    step sweep "$SWEEP_LIMIT" "$PY" scripts/gpu_check_sweep.py --model "$MODEL" --device "$DEVICE" --rates "$RATES" \
        --duration "$DURATION" --slo-tpot "$TPOT" --max-num-seqs "$SEQS" --kv-cache-memory "$KV" --out /tmp/gpu_check_sweep \
        >/tmp/gpu_check_sweep.log 2>&1
    cp /tmp/gpu_check_sweep/sweep-report/sweep.json "$OUT/sweep.json" 2>/dev/null
    grep -E "goodput .* req/s|^knee|sweep verdict|Error|error" /tmp/gpu_check_sweep.log | tail -n 12 | tee -a "$SUMMARY"
else
    say "step sweep: skipped, only $LEFT s of the 8-minute budget left"
fi
say "gpu_check done in $(elapsed) s; files in $OUT"
