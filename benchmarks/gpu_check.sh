#!/usr/bin/env bash
# The prepared GPU check of lad's throughput (issue 15), for one run on the H200 machine:
#
#   bash benchmarks/gpu_check.sh        # from the repository root; results under $OUT
#
# Steps, each under its own `timeout` so one slow step cannot eat the others' time (~6.5 min
# in all at most; the limits below add up to 385 s plus the wheel install):
#   equality   CPU vs CUDA, fast vs eager capture, packed vs stock vision, prefetched vs serial
#              records, host syncs and kernels the capture adds   -> equality.json
#   7b         bench_throughput --shape 7b   N = 4 8 12, batch 8  -> throughput_7b.json
#   2b         bench_throughput --shape 2b                        -> throughput_2b.json
#   256m       bench_throughput --shape 256m                      -> throughput_256m.json
#   capture    bench_backend (24-layer tiny LLaVA, batch 1), the small-model capture cost
#              measured in issue 15 (lad/plain 1.43 / 1.20 / 1.39)  -> bench_backend.json
#   vllm       bench_vllm: the vLLM engine beside HF on the same records, only where
#              LAD_VLLM_PYTHON names a python with vLLM (pip install vllm) -> bench_vllm.json
# plus gpu_check.log (everything printed). Wheels missing on the machine (transformers 5.24.0,
# orjson, num2words) are installed from .whl/ when it is there (../shared/notes/gpu.md).
#
# LAD_GPU_CHECK_CPU=1 runs the same steps on a CPU with tiny shapes (tests this script).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/lad-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$PWD
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi

if [ "${LAD_GPU_CHECK_CPU:-0}" = 1 ]; then
    DEVICE=(--device cpu)
    SIZE=(--tiny --ns 2 4 --batch-size 2 --batches 2 --repeats 1)
    SMALL=(--layers 4 --ns 2 --repeats 1)
else
    DEVICE=(--device cuda)
    SIZE=(--ns 4 8 12 --batch-size 8 --batches 3 --repeats 2)
    SMALL=(--ns 4 8 12 --repeats 5)
fi

step() {  # step NAME SECONDS COMMAND...: run it under a time limit, say how it ended
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "=== $name (limit ${limit} s): $*"
    timeout -k 10 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s$([ $rc = 124 ] && echo ' (timed out)')"
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
    python3 -c "import torch, transformers, sys; print('python', sys.version.split()[0], \
'torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available(), 'cpus', __import__('os').cpu_count())"
    step equality 60 python3 benchmarks/gpu_equality.py "${DEVICE[@]}" --json "$OUT/equality.json"
    step 7b 150 python3 benchmarks/bench_throughput.py "${DEVICE[@]}" --shape 7b "${SIZE[@]}" \
        --json "$OUT/throughput_7b.json"
    step 2b 70 python3 benchmarks/bench_throughput.py "${DEVICE[@]}" --shape 2b "${SIZE[@]}" \
        --modes plain record lad serial prep --json "$OUT/throughput_2b.json"
    step 256m 75 python3 benchmarks/bench_throughput.py "${DEVICE[@]}" --shape 256m "${SIZE[@]}" \
        --modes plain record lad prep --json "$OUT/throughput_256m.json"
    step capture 30 python3 benchmarks/bench_backend.py "${DEVICE[@]}" "${SMALL[@]}" --no-memory \
        --out "$OUT/bench_backend.json"
    # The vLLM engine beside the HF backend (docs/backends.md, "The vLLM engine"), where a python
    # with vLLM is given (LAD_VLLM_PYTHON; the HF half runs in python3): bench_vllm.json.
    if [ -n "${LAD_VLLM_PYTHON:-}" ]; then
        step vllm 120 env LAD_HF_PYTHON=python3 "$LAD_VLLM_PYTHON" benchmarks/bench_vllm.py \
            "${DEVICE[@]}" --items 32 --batch-size 16 --json "$OUT/bench_vllm.json"
    fi
    date -u
} 2>&1 | tee "$OUT/gpu_check.log"
