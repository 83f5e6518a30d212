# Sourced by benchmarks/gpu_throughput.sh and benchmarks/gpu_check.sh: sets PY to a Python whose
# torch has CUDA. $PYTHON when set, else python3, else ./.venv/bin/python when it already has a
# CUDA build; otherwise .ci/install builds ./.venv with GEOSWEEP_TORCH=torch (the default CUDA
# wheel), which needs a reachable package index. Returns 1 (PY unset) when none has CUDA.
has_cuda_torch() {
    "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
}
pick_cuda_python() {
    local who=$1 c
    for c in ${PYTHON:-} python3 .venv/bin/python; do
        if [ -n "$c" ] && has_cuda_torch "$c"; then PY=$c; return 0; fi
    done
    echo "$who: no Python with a CUDA torch; installing .venv (GEOSWEEP_TORCH=torch)"
    GEOSWEEP_TORCH=torch timeout 300 bash .ci/install || echo "$who: install failed"
    if has_cuda_torch .venv/bin/python; then PY=.venv/bin/python; return 0; fi
    echo "$who: no CUDA torch available"
    return 1
}
