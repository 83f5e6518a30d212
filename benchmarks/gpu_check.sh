#!/usr/bin/env bash
# The GPU path's device check (benchmarks/gpu_check.py: (a) a geosweep run of gpu_smoke vs the
# same trainings back to back, (b) compiled vs eager gradients per family, (c) tokens/s and MFU
# per family, (d) Muon and Manifold Muon step time), <= 8 minutes on one H200. Output under
# $OUT (default ./gpu_check_out): gpu_check.log (everything printed), gpu_check.json (the last
# line: every figure) and nvidia-smi.txt. Extra arguments go to the script.
#
#   benchmarks/gpu_check.sh           # on a CUDA machine
#   benchmarks/gpu_check.sh --cpu     # dry, tiny sizes, any machine (what CI runs)
#
# Python: --cpu: $PYTHON, else ./.venv/bin/python, else python3. Otherwise
# benchmarks/cuda_python.sh ($PYTHON, python3 or ./.venv/bin/python with a CUDA torch, else an
# install). Check (a) also needs geosweep's dependencies (Ray, MLflow) in that Python.
#
# Wall time: the checks' budgets (160 + 60 + 150 + 80 s on a GPU), a check past its own stopped
# 10 s later; `timeout` is a last resort at 475 s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
CPU=0
for a in "$@"; do [ "$a" = --cpu ] && CPU=1; done
if [ "$CPU" = 1 ]; then
    PY=${PYTHON:-}
    [ -z "$PY" ] && { [ -x .venv/bin/python ] && PY=.venv/bin/python || PY=python3; }
else
    source benchmarks/cuda_python.sh
    pick_cuda_python gpu_check.sh || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
        --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout 475 "$PY" benchmarks/gpu_check.py --grace 10 --out "$OUT/sweeps" \
    --json-out "$OUT/gpu_check.json" "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
