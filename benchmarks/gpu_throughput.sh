#!/usr/bin/env bash
# Runs benchmarks/gpu_throughput.py on a CUDA machine and leaves its output under $OUT
# (default ./gpu_throughput_out): gpu_throughput.log (everything printed), gpu_throughput.json
# (the last line: all figures) and nvidia-smi.txt. Extra arguments go to the script.
#
# Python: $PYTHON, else python3 when it already has a CUDA build of torch (the workloads need
# torch alone, run from this checkout through PYTHONPATH; nothing is installed or downloaded).
# Otherwise .ci/install builds ./.venv with GEOSWEEP_TORCH=torch (the default CUDA wheel),
# which needs a reachable package index.
#
# Wall time: the script's own budget (GPU_THROUGHPUT_BUDGET_S, default 480 s) plus at most
# --grace 45 s for a row still running when it ends; `timeout` is a last resort at 560 s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_throughput_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
has_cuda_torch() {
    "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
}
if ! has_cuda_torch "$PY"; then
    echo "gpu_throughput.sh: $PY has no CUDA torch; installing .venv (GEOSWEEP_TORCH=torch)"
    GEOSWEEP_TORCH=torch timeout 300 bash .ci/install || echo "gpu_throughput.sh: install failed"
    PY=.venv/bin/python
    has_cuda_torch "$PY" || { echo "gpu_throughput.sh: no CUDA torch available"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
    --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout 560 "$PY" benchmarks/gpu_throughput.py --grace 45 \
    --json-out "$OUT/gpu_throughput.json" "$@" 2>&1 | tee "$OUT/gpu_throughput.log"
