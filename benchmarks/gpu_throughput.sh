#!/usr/bin/env bash
# Runs benchmarks/gpu_throughput.py on a CUDA machine and leaves its output under $OUT
# (default ./gpu_throughput_out): gpu_throughput.log (everything printed), gpu_throughput.json
# (the last line: all figures) and nvidia-smi.txt. Extra arguments go to the script.
#
# Python: benchmarks/cuda_python.sh ($PYTHON, python3 or ./.venv/bin/python with a CUDA torch;
# the workloads need torch alone, run from this checkout through PYTHONPATH), else an install.
#
# Wall time: the script's own budget (GPU_THROUGHPUT_BUDGET_S, default 480 s) plus at most
# --grace 45 s for a row still running when it ends; `timeout` is a last resort at 560 s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_throughput_out}
mkdir -p "$OUT"
source benchmarks/cuda_python.sh
pick_cuda_python gpu_throughput.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
    --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout 560 "$PY" benchmarks/gpu_throughput.py --grace 45 \
    --json-out "$OUT/gpu_throughput.json" "$@" 2>&1 | tee "$OUT/gpu_throughput.log"
