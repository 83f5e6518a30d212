"""Checks (b), (c) and (d) of benchmarks/gpu_check.py, and what every check shares: the
context (device, sizes, the running check's deadline), a result row, tables, targets.

Timing is benchmarks/gpu_throughput.py's (``run_row``: fwd + bwd + clip + optimizer step on
synthetic tokens) and the compiled-vs-eager comparison benchmarks/compile_check.py's: this
module only chooses the rows and reads the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import compile_check
import gpu_throughput as gt
import torch

from workloads.config import PRESETS, ConfigError

DUAL_KEY = "optim.manifold.dual_mode"  # fast (default) | paper | exact


@dataclass
class Ctx:
    mode: str  # gpu | cpu
    device: torch.device
    profile: dict
    out: str = ""
    check_t0: float = 0.0
    deadline: float = math.inf

    def start_check(self, budget: float) -> None:
        self.check_t0 = time.perf_counter()
        self.deadline = self.check_t0 + budget

    def left(self) -> float:
        return self.deadline - time.perf_counter()


@dataclass
class Result:
    check: str
    name: str
    status: str = "running"  # running | ok | DIFF | skipped | error | stopped
    values: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "name": self.name, "status": self.status,
                "note": self.note, **{k: _clean(v) for k, v in self.values.items()}}


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.6g}") if math.isfinite(v) else None
    return v


def cleanup(device: torch.device) -> None:
    gt._cleanup(device)


def _skip(rows: list[Result], key: str, name: str, why: str) -> None:
    rows.append(Result(key, name, "skipped", note=why))
    print(f"  {name:<30} skipped: {why}", flush=True)


def _show(r: Result, cols: list[str]) -> None:
    vals = "  ".join(f"{c}={_fmt(r.values.get(c))}" for c in cols if c in r.values)
    print(f"  {r.name:<30} {r.status:<8} {vals}  {r.note}".rstrip(), flush=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.2e}" if 0 < abs(v) < 1e-2 else f"{v:,.3f}" if abs(v) < 1e3 else f"{v:,.0f}"
    return str(v)


def table(key: str, rows: list[Result]) -> str:
    """One check's rows as an aligned text table (one column per figure, as wide as its
    name); the notes follow, one per row that has one. Rows with more than 8 figures each
    (check a) are listed one figure per line instead."""
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r.values if c not in cols]
    if len(cols) > 8:
        out = [f"({key})"]
        for r in rows:
            out.append(f"    {r.name}: {r.status}{f' ({r.note})' if r.note else ''}")
            out += [f"        {c:<32}{_fmt(v):>14}" for c, v in r.values.items()]
        return "\n".join(out)
    width = max([len(r.name) for r in rows] + [8]) + 2
    widths = {c: max(len(c), *(len(_fmt(r.values.get(c, ""))) for r in rows)) + 2
              for c in cols}
    lines = [f"({key}) {'row':<{width}}{'status':<9}" + "".join(f"{c:>{widths[c]}}"
                                                              for c in cols)]
    for r in rows:
        lines.append(f"    {r.name:<{width}}{r.status:<9}"
                     + "".join(f"{_fmt(r.values.get(c, '')):>{widths[c]}}" for c in cols))
    lines += [f"    {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(lines)


# --- (b) compiled vs eager -------------------------------------------------------------------
def check_b(ctx: Ctx, rows: list[Result]) -> None:
    """``b_rows`` in order while the budget lasts: SpheretNorm p=1 under bf16 autocast first
    (where compiled gradients once differed on CUDA), then fp32 per family."""
    p = ctx.profile
    todo = p["b_rows"]  # (family, dtype), most telling first
    cuda = ctx.device.type == "cuda"
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    try:
        for fam, dtype in todo:
            name = f"{fam} {dtype}"
            if ctx.left() < (15 if cuda else 20):
                _skip(rows, "b", name, f"budget: {max(0.0, ctx.left()):.0f} s left")
                continue
            r = Result("b", name)
            rows.append(r)
            torch._dynamo.reset()
            got = compile_check.compare(compile_check.FAMILIES[fam], str(ctx.device),
                                        steps=p["b_steps"], batch=p["b_batch"], dtype=dtype,
                                        model=p["b_model"])
            r.values = {k: got[k] for k in ("loss_rel", "grad_rel", "param_grad_rel",
                                            "compile_s")}
            # fp32: rounding is ~1e-6 (the test's bounds, x10 for GPU reductions); bf16
            # autocast: compiled and eager round differently (~2e-3 in the gradient on CPU)
            tol = (1e-4, 1e-4, 1e-3) if dtype == "float32" else (1e-2, 2e-2, 5e-2)
            ok = all(got[k] < t for k, t in zip(("loss_rel", "grad_rel", "param_grad_rel"),
                                                tol, strict=True))
            r.status = "ok" if ok else "DIFF"
            r.note = f"tolerance {tol[0]:g}/{tol[1]:g}/{tol[2]:g}"
            _show(r, list(r.values))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32


# --- (c) throughput --------------------------------------------------------------------------
def _model_cfg(ctx: Ctx):
    wcfg = PRESETS[ctx.profile["preset"]]()
    vocab = wcfg.model.vocab_size or (65 if wcfg.data.tokenizer == "char" else 50304)
    return wcfg, replace(wcfg.model, vocab_size=vocab)


def _timing_args(ctx: Ctx) -> argparse.Namespace:
    p = ctx.profile
    return argparse.Namespace(steps=p["steps"], muon_steps=p["muon_steps"],
                              warmup=p["warmup"], dtype=p["dtype"],
                              peak_tflops=p["peak_tflops"])


def _estimate_gb(wcfg, mcfg, batch: int, dtype: str) -> float:
    from orchestrator.sweep.gpu_fit import trial_gpu_bytes

    cfg = replace(wcfg, model=mcfg, train=replace(wcfg.train, batch_size=batch,
                                                  dtype="bf16" if dtype == "bf16" else
                                                  "float32"))
    return trial_gpu_bytes(cfg) / 1e9


def _time_row(ctx: Ctx, rows: list[Result], key: str, row: gt.Row, batch: int,
              extra: dict | None = None) -> gt.Row:
    wcfg, mcfg = _model_cfg(ctx)
    r = Result(key, f"{row.name} B={batch}")
    rows.append(r)
    try:
        gt.run_row(row, _timing_args(ctx), ctx.device, mcfg, batch)
    finally:
        with contextlib.suppress(Exception):
            cleanup(ctx.device)
    r.values = {"tokens_per_s": row.tokens_per_s, "ms_per_step": row.ms_per_step,
                "mfu": row.mfu, "peak_mem_gb": row.peak_mem_gb,
                "est_mem_gb": _estimate_gb(wcfg, mcfg, batch, ctx.profile["dtype"]),
                **({"compile_s": row.compile_s} if row.compile else {}), **(extra or {})}
    r.status = "ok"
    _show(r, ["tokens_per_s", "mfu", "ms_per_step", "peak_mem_gb", "compile_s"])
    return row


def _c_plan(p: dict) -> list[tuple[str, bool, int]]:
    """(family, compiled, batch) in the order that matters when the budget runs out: every
    family eager at the first batch, the target rows (Pre-LN and SpheretNorm p=1 compiled,
    then at the second batch), the other families at the second batch, then compiled."""
    fams, first = [lbl for lbl, _ in gt.FAMILIES], p["compiled_first"]
    b1, rest = p["batches"][0], p["batches"][1:]
    plan = [(f, False, b1) for f in fams] + [(f, True, b1) for f in first]
    for b in rest:
        plan += [(f, False, b) for f in first]
        plan += [(f, True, b) for f in first] if p["compile_more"] else []
        plan += [(f, False, b) for f in fams if f not in first]
    if p["compile_more"]:
        plan += [(f, True, b1) for f in fams if f not in first]
    return plan


def check_c(ctx: Ctx, rows: list[Result]) -> None:
    p = ctx.profile
    fams = dict(gt.FAMILIES)
    base: dict[tuple[bool, int], float] = {}
    # as benchmarks/gpu_throughput.py times them (the fp32 matmuls outside autocast)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    for lbl, comp, batch in _c_plan(p):
        name = f"{lbl}{'+compile' if comp else ''} B={batch}"
        need = p["compile_reserve"] if comp else 5.0
        if ctx.left() < need:
            _skip(rows, "c", name, f"budget: {max(0.0, ctx.left()):.0f} s left")
            continue
        row = _time_row(ctx, rows, "c", gt.Row(lbl, fams[lbl], compile=comp), batch)
        if lbl == "pre_ln":
            base[(comp, batch)] = row.tokens_per_s
        rows[-1].values["vs_pre_ln"] = row.tokens_per_s / base.get((comp, batch), math.nan)


# --- (d) optimizer step time -----------------------------------------------------------------
def _dual_key_present() -> bool:
    try:
        gt._optim_cfg({"name": "muon", "set": {DUAL_KEY: "fast"}})
    except ConfigError:
        return False
    return True


def check_d(ctx: Ctx, rows: list[Result]) -> None:
    batch = ctx.profile["batches"][0]
    plan = [("adamw", {}), ("muon", {"name": "muon"})]
    plan += [(f"mmuon_{a}_{m}", {"name": "muon", "assignment": a, "set": {DUAL_KEY: m}})
             for a in ("hetero", "all_stiefel") for m in ("paper", "fast")]
    has_dual = _dual_key_present()
    ms: dict[str, float] = {}
    for label, opt in plan:
        label = f"pre_ln/{label}"
        name = f"{label} B={batch}"
        if "set" in opt and not has_dual:
            _skip(rows, "d", name, f"{DUAL_KEY} is not a config key in this checkout (the "
                  "dual modes land with the Manifold Muon work)")
            continue
        if ctx.left() < 10:
            _skip(rows, "d", name, f"budget: {max(0.0, ctx.left()):.0f} s left")
            continue
        # every row times muon_steps steps (AdamW's too: one step count for every ratio)
        row = gt.Row(label, {"family": "pre_ln"}, optim=opt or {"name": "adamw"})
        _time_row(ctx, rows, "d", row, batch)
        ms[label] = row.ms_per_step
        r = rows[-1]
        r.values = {"ms_per_step": row.ms_per_step, "steps": row.steps,
                    "vs_muon": row.ms_per_step / ms.get("pre_ln/muon", math.nan),
                    "peak_mem_gb": row.peak_mem_gb}
        if label == "pre_ln/muon":
            r.values["vs_adamw"] = row.ms_per_step / ms.get("pre_ln/adamw", math.nan)


# --- targets ---------------------------------------------------------------------------------
def _find(results: dict[str, list[Result]], key: str, name: str) -> dict | None:
    for r in results.get(key, []):
        if r.name == name and r.status == "ok":
            return r.values
    return None


def targets(results: dict[str, list[Result]], dry: bool) -> list[dict[str, Any]]:
    """The issue's targets that the figures can answer, with the figure and a verdict
    (``dry``: the --cpu run, whose figures judge nothing)."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, target: str, ok: bool | None) -> None:
        v = "-" if value is None or not math.isfinite(value) else round(value, 3)
        out.append({"name": name, "value": v, "target": target,
                    "verdict": "dry run" if dry else "not measured" if ok is None or v == "-"
                    else ("met" if ok else "missed")})

    a = next((r.values for r in results.get("a", []) if r.name == "sweep" and
              r.status == "ok"), None)
    if a is not None:
        o = a.get("overhead_per_trial_s")
        add("per-trial overhead (a)", o, "<= 2 s", None if o is None else o <= 2.0)
    for b, goal in ((16, 0.45), (32, 0.50)):
        v = _find(results, "c", f"pre_ln+compile B={b}")
        m = v["mfu"] if v else None
        add(f"compiled Pre-LN MFU B={b}", m, f">= {goal}", None if m is None else m >= goal)
    for comp, goal in ((False, 0.85), (True, 0.95)):
        sfx = "+compile" if comp else ""
        v = _find(results, "c", f"spheret_p1{sfx} B=16")
        x = v["vs_pre_ln"] if v else None
        add(f"SpheretNorm p=1 / Pre-LN tokens/s{sfx or ' eager'} B=16", x, f">= {goal}",
            None if x is None else x >= goal)
    v = _find(results, "d", "pre_ln/muon B=16")
    x = v.get("vs_adamw") if v else None
    add("Muon / AdamW step time B=16", x, "<= 1.15", None if x is None else x <= 1.15)
    return out
