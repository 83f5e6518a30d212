"""The summary scalars of a collect (``cont/*``): means of its tidy rows at one step.

Every key is a mean over the rows named in its line (empty means are dropped):
- ``resid_top1_mean`` / ``ctrl_mean``: w.top1 on the residual side (``RESIDUAL_SIDES``) / the
  hidden-side control; ``resid_top1_d{d}_mean``: w.dist_top1 at layer distance d, residual side.
- ``grad_resid_top1_mean`` / ``grad_ctrl_top1_mean`` / ``grad_resid_top1_d{d}_mean``: the same
  for gp.* (gradient continuity on the probe batches).
- ``ones_{v|u}_mean``, ``grad_ones_{v|u}_mean``: w.ones / gp.ones over every tracked matrix.
- ``resid_ctop1_mean`` / ``ctrl_ctop1_mean`` / ``resid_ctop1_d{d}_mean`` and
  ``grad_resid_ctop1_mean`` / ``grad_ctrl_ctop1_mean``: the all-ones-blind versions (wc.*,
  gpc.*; ``metrics.centred``).
- ``self_resid_mean``, ``self0_resid_mean``: M7 (w.self / w.self0), residual side.
- ``grad_coherence_mean`` (g.coh_mean), ``cgrad_coherence_mean`` (cg.coh), ``rel_change_mean``.
- model-wide: ``stream_growth`` (act.stream_growth), ``probe_loss`` (gp.loss).
"""

from __future__ import annotations

__all__ = ["RESIDUAL_SIDES", "summarize"]

# Which singular-vector side reads/writes the residual stream (SCIENCE 4.2); the other is the
# hidden-side control. The toy MLP's hidden matrices map stream to stream: both sides count.
RESIDUAL_SIDES: dict[str, str] = {
    "q": "v", "k": "v", "v": "v", "gate": "v", "up": "v", "fc": "v",
    "o": "u", "down": "u", "proj": "u", "hidden": "vu",
}


def summarize(rows: list[dict], step: int) -> dict[str, float]:
    """``cont/*`` means of the rows at ``step`` (see the module docstring)."""

    def mean(xs: list[float]) -> float:  # NaN when empty
        return sum(xs) / len(xs) if xs else float("nan")

    lists: dict[str, list[float]] = {}
    model_wide = {"act.stream_growth": "cont/stream_growth", "gp.loss": "cont/probe_loss"}
    for r in rows:
        if r["step"] != step:
            continue
        name, mod = r["metric"], r["module"]
        side = RESIDUAL_SIDES.get(mod.split("_")[-1], "")
        resid = name[-1] in side
        key = None
        if name in ("w.top1_v", "w.top1_u"):
            # the residual side: v1 of readers, u1 of o/proj/down, both for the MLP's
            # hidden matrices (this was cont/v1_mean, a name that said only v1)
            key = "resid_top1_mean" if resid else "ctrl_mean"
        elif name in ("gp.top1_v", "gp.top1_u"):
            key = "grad_resid_top1_mean" if resid else "grad_ctrl_top1_mean"
        elif name in ("wc.top1_v", "wc.top1_u"):
            key = "resid_ctop1_mean" if resid else "ctrl_ctop1_mean"
        elif name in ("gpc.top1_v", "gpc.top1_u"):
            key = "grad_resid_ctop1_mean" if resid else "grad_ctrl_ctop1_mean"
        elif name in ("wc.dist_top1_v", "wc.dist_top1_u") and resid:
            key = f"resid_ctop1_d{r['next_layer'] - r['layer']}_mean"
        elif name in ("w.dist_top1_v", "w.dist_top1_u") and resid:
            key = f"resid_top1_d{r['next_layer'] - r['layer']}_mean"
        elif name in ("gp.dist_top1_v", "gp.dist_top1_u") and resid:
            key = f"grad_resid_top1_d{r['next_layer'] - r['layer']}_mean"
        elif name.startswith("w.ones_"):
            key = f"ones_{name[-1]}_mean"
        elif name.startswith("gp.ones_"):
            key = f"grad_ones_{name[-1]}_mean"
        elif name.startswith(("w.self_", "w.self0_")) and resid:
            key = name[2:name.rindex("_")] + "_resid_mean"
        elif name == "g.coh_mean":
            key = "grad_coherence_mean"
        elif name == "cg.coh":
            key = "cgrad_coherence_mean"
        elif name == "w.rel_change_fro":
            key = "rel_change_mean"
        elif name in model_wide:
            lists[model_wide[name]] = [r["value"]]
        if key is not None:
            lists.setdefault(f"cont/{key}", []).append(r["value"])
    out = {k: mean(v) for k, v in lists.items()}
    return {k: v for k, v in out.items() if v == v}  # drop empty (NaN) means
