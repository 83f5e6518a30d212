"""Peak memory and time of the streamed continuity analysis (workloads.pretrained) vs checkpoint
size: the peak RSS must stay flat (about two matrices plus the interpreter), not grow with L.

Builds Llama-style synthetic checkpoints itself (``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``; fp32, sharded 8 layers per file with a
``model.safetensors.index.json``), analyses each in a fresh subprocess that reports its own peak
RSS (``VmHWM``) and the RSS right after imports, then deletes the checkpoint.

    python benchmarks/checkpoint_memory.py [--layers 4 8 16 32] [--d 512] [--f 1376]
                                          [--exact-max 256] [--dir /tmp]

``--exact-max``: matrices with min(m, n) above it take the block-power path (SCIENCE 4.4.3)
instead of the exact SVD; the default keeps the run short, and memory is the same either way.
Prints a table, then one JSON line (the last line) with ``rss_growth_ratio`` =
(peak RSS largest / smallest) / (size largest / smallest), ~0 when flat, 1 when proportional.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LAYERS_PER_SHARD = 8


def build_checkpoint(folder: Path, n_layers: int, d: int, f: int, seed: int = 0) -> int:
    """A sharded Llama-style safetensors checkpoint; returns its size in bytes."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    shapes = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (d, d), "self_attn.v_proj": (d, d),
              "self_attn.o_proj": (d, d), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d),
              "mlp.down_proj": (d, f)}
    weight_map, size = {}, 0
    shards = range(0, n_layers, LAYERS_PER_SHARD)
    for s, first in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for i in range(first, min(first + LAYERS_PER_SHARD, n_layers)):
            for key, shape in shapes.items():
                t = torch.randn(*shape, generator=g) / shape[1] ** 0.5
                tensors[f"model.layers.{i}.{key}.weight"] = t
        save_file(tensors, str(folder / name))
        weight_map.update({k: name for k in tensors})
        size += (folder / name).stat().st_size
        del tensors  # only one shard in this process at a time
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "num_hidden_layers": n_layers, "hidden_size": d,
         "intermediate_size": f}))
    return size


def peak_rss_kb() -> int:
    """This process's peak RSS in KiB: VmHWM (per address space, so not inherited from the
    forking parent as ``ru_maxrss`` is), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def child(path: str, exact_max: int) -> None:
    """Runs in the fresh subprocess: one JSON line with its own peak RSS and timings."""
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from workloads.pretrained import analyse

    rss_import = peak_rss_kb()
    t0 = time.perf_counter()
    a = analyse(path, exact_max=exact_max)
    dt = time.perf_counter() - t0
    peak = peak_rss_kb()
    print(json.dumps({"rss_import_kb": rss_import, "rss_peak_kb": peak, "time_s": dt,
                      "rows": len(a.rows), "n_layers": a.n_layers}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--f", type=int, default=1376)
    ap.add_argument("--exact-max", type=int, default=256)
    ap.add_argument("--dir", default=None, help="parent folder of the temporary checkpoints")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.exact_max)

    results = []
    with tempfile.TemporaryDirectory(prefix="geosweep-ckpt-bench-", dir=args.dir) as tmp:
        for L in args.layers:
            folder = Path(tmp) / f"llama-{L}"
            size = build_checkpoint(folder, L, args.d, args.f)
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(folder), "--exact-max",
                 str(args.exact_max)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r.update(n_layers=L, size_mb=size / 2**20)
            results.append(r)
            shutil.rmtree(folder)  # keep disk use to one checkpoint at a time

    one = 4 * (args.d * args.d * 4 + 3 * args.d * args.f)  # bytes of one layer, fp32
    print(f"d={args.d} f={args.f}  one layer = {one / 2**20:.1f} MiB, "
          f"largest matrix = {4 * args.d * args.f / 2**20:.1f} MiB")
    print(f"{'layers':>6} | {'size MiB':>9} | {'RSS import MiB':>14} | {'peak RSS MiB':>12} | "
          f"{'analysis MiB':>12} | {'time s':>7}")
    for r in results:
        print(f"{r['n_layers']:>6} | {r['size_mb']:>9.1f} | {r['rss_import_kb'] / 1024:>14.1f} | "
              f"{r['rss_peak_kb'] / 1024:>12.1f} | "
              f"{(r['rss_peak_kb'] - r['rss_import_kb']) / 1024:>12.1f} | {r['time_s']:>7.1f}")
    lo, hi = results[0], results[-1]
    ratio = (hi["rss_peak_kb"] / lo["rss_peak_kb"]) / (hi["size_mb"] / lo["size_mb"])
    print(json.dumps({
        "rss_growth_ratio": round(ratio, 4),
        "layers": [r["n_layers"] for r in results],
        "sizes_mb": [round(r["size_mb"], 1) for r in results],
        "rss_peak_mb": [round(r["rss_peak_kb"] / 1024, 1) for r in results],
        "rss_analysis_mb": [round((r["rss_peak_kb"] - r["rss_import_kb"]) / 1024, 1)
                            for r in results],
        "times_s": [round(r["time_s"], 2) for r in results],
        "one_layer_mb": round(one / 2**20, 2), "d": args.d, "f": args.f,
        "exact_max": args.exact_max,
    }))


if __name__ == "__main__":
    main()
