"""The instability rows of ``MetricsCollector`` (docs/science.md §3.5; names: collect.py).

Split out of workloads/metrics/collect.py to keep files small: constraint health of every
managed matrix, attention logit bounds from the q/k weights, and attention statistics on the
probe batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from workloads.metrics import instability as I
from workloads.metrics.collect_groups import STACKED_ROLES, _Group

__all__ = ["instability_rows"]


class _ProbeDone(Exception):
    pass


def _attn_modules(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return []
    return [b.attn for b in blocks if hasattr(getattr(b, "attn", None), "scores")]


def _probe_inputs(model: nn.Module, probe: Tensor, attns: list[nn.Module]) -> list[Tensor]:
    """Each attention module's branch input x (B, T, C) on the probe batch (one forward)."""
    captured: dict[int, Tensor] = {}

    def hook(i: int):
        def fn(_mod, args, kwargs):
            captured.setdefault(i, args[0] if args else kwargs["x"])
        return fn

    def stop(_mod, _args, _kwargs):
        raise _ProbeDone  # every input captured: skip the rest of the forward (lm_head)

    handles = [a.register_forward_pre_hook(hook(i), with_kwargs=True)
               for i, a in enumerate(attns)]
    handles.append(attns[-1].register_forward_pre_hook(stop, with_kwargs=True))
    was_training = model.training
    try:
        model.eval()
        model(probe)
    except _ProbeDone:
        pass
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return [captured[i] for i in range(len(attns))]


def instability_rows(model: nn.Module, roles: list[Any], groups_list: list[_Group],
                     sigma: dict[str, Tensor], probe: Tensor | None,
                     ) -> tuple[list, dict[str, float]]:
    """(raw rows ``(metric, module, layers, pair, values)``, ``inst/*`` scalars); ``sigma`` is
    the collector's label -> (L,) top singular value of this collect."""
    out: list = []
    scalars: dict[str, float] = {}
    for mr in roles:  # constraint health of every managed matrix, as stored
        if mr.role in STACKED_ROLES and mr.param.dim() == 2:
            W = mr.param.detach()
            for name, fn in (("stiefel_viol", I.stiefel_violation),
                             ("dgram_viol", I.dgram_violation),
                             ("colnorm_spread", I.column_norm_spread)):
                out.append((f"inst.{name}", mr.role, [mr.layer], False, fn(W).reshape(1)))
    attns = _attn_modules(model)
    groups = {g.label: g for g in groups_list}
    if attns and "q" in groups and "k" in groups:
        Wq, Wk = groups["q"].weights(), groups["k"].weights()
        n_head = int(getattr(attns[0], "n_head", 0) or 0)
        lay = groups["q"].layers
        for r in "qkv":  # from this collect's top singular values (exact or cheap path)
            if r in sigma:
                scalars[f"inst/sigma_max_{r}"] = float(sigma[r].max())
        if n_head:
            kappa = I.head_logit_bound(Wq, Wk, n_head).amax(-1)
            out.append(("inst.kappa_max", "attn", lay, False, kappa))
            out.append(("inst.kappa_rope_max", "attn", lay, False,
                        I.head_logit_bound_rope(Wq, Wk, n_head).amax(-1)))
            scalars["inst/kappa_max"] = float(kappa.max())
    if attns and probe is not None:
        xs = _probe_inputs(model, probe, attns)
        stats = [I.attention_stats(a.scores(x)) for a, x in zip(attns, xs)]
        layers = list(range(len(attns)))
        for key, name in (("max_abs", "max_logit"), ("rms", "logit_rms"),
                          ("row_range", "row_range"), ("sat_0p9", "sat_0p9"),
                          ("sat_0p99", "sat_0p99"), ("entropy_mean", "entropy_mean"),
                          ("entropy_min", "entropy_min"), ("jacobian_fro", "jacobian_fro")):
            vals = torch.stack([s[key] for s in stats])
            out.append((f"inst.{name}", "attn", layers, False, vals))
            agg = vals.min() if name.startswith("entropy") else vals.max()
            scalars[f"inst/{name}"] = float(agg)
    return out, scalars
