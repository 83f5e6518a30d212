"""Build the optimizers of a run: AdamW for everything, or Muon for the hidden matrices + AdamW.

``optim.name == "adamw"``: one AdamW, weight decay on >= 2-d params (nanoGPT).
``optim.name == "muon"``: the matrices of ``model.matrix_roles()`` whose role is in
``MUON_ROLES`` go to ``Muon`` (grouped by constraint); embeddings, lm_head / io matrices, norm
gains, biases, scalars and ``stream.*`` stay on AdamW. Every trainable parameter lands in
exactly one group, and ``assert_partition`` checks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workloads.config import ConfigError, OptimConfig
from workloads.geometry.dual import DualOptions
from workloads.geometry.manifolds import MANIFOLDS, get_manifold
from workloads.optim.assignment import MUON_ROLES, matrix_kind, resolve_assignment
from workloads.optim.muon import Muon
from workloads.validate import check_dual

__all__ = [
    "ManagedMatrix",
    "Optimizers",
    "OptimizerGroupError",
    "assert_partition",
    "build_optimizers",
]


class OptimizerGroupError(RuntimeError):
    """A trainable parameter is in no optimizer group, or in more than one."""


@dataclass(frozen=True)
class ManagedMatrix:
    """A Muon-managed matrix: its constraint and whether it is stepped transposed (wide)."""

    name: str
    role: str
    layer: int
    kind: str
    constraint: str
    shape: tuple[int, int]
    transposed: bool


@dataclass
class Optimizers:
    """What the loop steps: ``set_lr(lr_t)`` each step, then ``step()`` and ``zero_grad()``."""

    adamw: torch.optim.AdamW | None
    muon: Muon | None
    base_lr: float
    muon_lr: float
    managed: dict[str, ManagedMatrix] = field(default_factory=dict)

    def _all(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.adamw, self.muon) if o is not None]

    def set_lr(self, lr_t: float) -> None:
        """AdamW gets lr_t; Muon follows the same schedule: lr_t * muon.lr / optim.lr."""
        if self.adamw is not None:
            for g in self.adamw.param_groups:
                g["lr"] = lr_t
        if self.muon is not None:
            for g in self.muon.param_groups:
                g["lr"] = lr_t * self.muon_lr / self.base_lr

    def step(self) -> None:
        for o in self._all():
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self._all():
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {
            "adamw": self.adamw.state_dict() if self.adamw is not None else None,
            "muon": self.muon.state_dict() if self.muon is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, opt in (("adamw", self.adamw), ("muon", self.muon)):
            if (opt is None) != (state.get(key) is None):
                raise ValueError(f"optimizer state has {key}={state.get(key) is not None}, "
                                 f"this run has {opt is not None}")
            if opt is not None:
                opt.load_state_dict(state[key])

    @property
    def constraints(self) -> dict[str, str]:
        return {name: m.constraint for name, m in self.managed.items()}

    def health(self) -> dict[str, dict[str, float]]:
        """Per manifold matrix (after its first step): the true residual ||P(W^T A + A^T W)||_F
        / n of the last direction applied, the passes its solve took, the smoothing ``dual_mu``
        of that direction (0: the exact optimum's) and the retraction displacement
        ||R(W') - W'||_F / ||W'||_F (docs/science.md §3.2, §3.5 item 7)."""
        if self.muon is None:
            return {}
        names, vals = [], []
        for group in self.muon.param_groups:
            for name, p in zip(group["names"], group["params"]):
                st = self.muon.state.get(p, {})
                if "dual_residual" in st:
                    names.append(name)
                    vals.append(torch.stack([st["dual_residual"].double(),
                                             st["retraction_displacement"].double(),
                                             st["dual_passes"].double(),
                                             st.get("dual_mu", st["dual_residual"] * 0).double()]))
        if not vals:
            return {}
        rows = torch.stack(vals).float().cpu().tolist()  # one host sync for all matrices
        return {
            n: {"constraint": self.managed[n].constraint if n in self.managed else "",
                "dual_residual": r[0], "retraction_displacement": r[1], "dual_passes": r[2],
                "dual_mu": r[3]}
            for n, r in zip(names, rows)
        }

    def dual_rows(self, step: int) -> list[dict[str, Any]]:
        """Tidy rows (docs/contracts.md) ``optim/dual_residual``, ``optim/dual_passes`` and
        ``optim/dual_mu`` per manifold matrix: module = its role, layer = its layer,
        next_layer = -1."""
        rows: list[dict[str, Any]] = []
        for name, row in self.health().items():
            m = self.managed.get(name)
            for key in ("dual_residual", "dual_passes", "dual_mu"):
                rows.append({"step": step, "metric": f"optim/{key}",
                             "module": m.role if m else name, "layer": m.layer if m else -1,
                             "next_layer": -1, "value": float(row[key])})
        return rows

    def stats(self) -> dict[str, float]:
        """``health()`` flattened for scalar logging (the metrics collector prefixes ``optim/``):
        ``dual_residual/<name>``, ``dual_passes/<name>``, ``dual_mu/<name>``,
        ``retraction_displacement/<name>`` and their ``_max``."""
        out: dict[str, float] = {}
        for name, row in self.health().items():
            for key in ("dual_residual", "dual_passes", "dual_mu", "retraction_displacement"):
                out[f"{key}/{name}"] = row[key]
                out[f"{key}_max"] = max(out.get(f"{key}_max", 0.0), row[key])
        return out


def assert_partition(named: dict[str, nn.Parameter], groups: Iterable[Iterable[Any]]) -> None:
    """Raise ``OptimizerGroupError`` unless every parameter of ``named`` is in exactly one group
    and the groups hold nothing else."""
    count: dict[int, int] = {id(p): 0 for p in named.values()}
    foreign = 0
    for group in groups:
        for p in group:
            if id(p) in count:
                count[id(p)] += 1
            else:
                foreign += 1
    name_of = {id(p): n for n, p in named.items()}
    missing = [name_of[i] for i, c in count.items() if c == 0]
    twice = [name_of[i] for i, c in count.items() if c > 1]
    if missing or twice or foreign:
        raise OptimizerGroupError(
            f"optimizer groups must partition the trainable parameters: missing {missing}, "
            f"in several groups {twice}, {foreign} parameter(s) not in the model"
        )


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    # named_parameters() already yields a tied parameter (wte / lm_head) once.
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _retract(W: torch.Tensor, constraint: str, dgram_retraction: str, exact: bool) -> torch.Tensor:
    transposed = W.shape[-2] < W.shape[-1]
    T = W.mT if transposed else W
    T = get_manifold(constraint).retract(T, exact=exact, retraction=dgram_retraction)
    return T.mT if transposed else T


def _managed_groups(model: nn.Module, named: dict[str, nn.Parameter], cfg: OptimConfig,
                    ) -> tuple[dict[str, ManagedMatrix], list[dict[str, Any]]]:
    """Muon's matrices (validated manifold settings): their ManagedMatrix records and param
    groups, one group per constraint in MANIFOLDS order."""
    mu, mf = cfg.muon, cfg.manifold
    managed: dict[str, ManagedMatrix] = {}
    muon_groups: list[dict[str, Any]] = []
    check_dual(mf)
    trainable_ids = {id(p) for p in named.values()}
    roles = [r for r in model.matrix_roles()
             if r.role in MUON_ROLES and id(r.param) in trainable_ids]
    constraints = resolve_assignment(roles, mf.assignment)
    for r in roles:
        if r.param.ndim != 2:
            raise ValueError(f"{r.name}: role {r.role!r} must be a 2-d matrix, "
                             f"got shape {tuple(r.param.shape)}")
        m, n = r.param.shape
        managed[r.name] = ManagedMatrix(r.name, r.role, r.layer, matrix_kind(r),
                                        constraints[r.name], (m, n), m < n)
    for c in MANIFOLDS:
        members = [r for r in roles if constraints[r.name] == c]
        if members:
            muon_groups.append({
                "params": [r.param for r in members], "names": [r.name for r in members],
                "constraint": c,
                "weight_decay": 0.0 if MANIFOLDS[c].constrained else mu.weight_decay,
            })
    return managed, muon_groups


def _initial_retraction(muon: Muon, cfg: OptimConfig) -> None:
    """init_match / init_on_manifold: move Muon's matrices onto their start, in place."""
    mu, mf = cfg.muon, cfg.manifold
    # --- init_match: one semi-orthogonal start for every assignment (matched scales) --------
    if mf.init_match:
        with torch.no_grad():
            for g in muon.param_groups:
                for p in g["params"]:
                    p.copy_(_retract(p.float(), "stiefel", mf.dgram_retraction,
                                     mu.msign == "svd").to(p.dtype))
    # --- init_on_manifold: start every constrained matrix on its manifold (Paper B) ----------
    if mf.init_on_manifold:
        with torch.no_grad():
            for g in muon.param_groups:
                if not MANIFOLDS[g["constraint"]].constrained:
                    continue
                for p in g["params"]:
                    W = _retract(p.float(), g["constraint"], mf.dgram_retraction,
                                 mu.msign == "svd")
                    p.copy_(W.to(p.dtype))


def build_optimizers(model: nn.Module, cfg: OptimConfig) -> Optimizers:
    """AdamW (+ Muon over the hidden matrices when ``cfg.name == "muon"``) for ``model``."""
    if cfg.name not in ("adamw", "muon", "sgd"):
        raise ConfigError(f"optim.name: {cfg.name!r} is not one of adamw, muon, sgd")
    named = _trainable(model)
    mu, mf = cfg.muon, cfg.manifold
    managed, muon_groups = _managed_groups(model, named, cfg) if cfg.name == "muon" else ({}, [])
    muon_ids = {id(p) for g in muon_groups for p in g["params"]}
    rest = [p for p in named.values() if id(p) not in muon_ids]
    adam_groups = [
        {"params": [p for p in rest if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0},
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    assert_partition(named, [g["params"] for g in adam_groups + muon_groups])

    # torch's fused AdamW exists on CPU too: one kernel for all tensors instead of torch's
    # default per-tensor loop (gpt-debug, 1 thread: 0.5 ms vs 2.2 ms a step); losses stay
    # within the golden tolerance (tests/workloads/test_train.py).
    fused = bool(rest) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                               for p in rest)
    if cfg.name == "sgd":
        # SGD with momentum (rotation-equivariant, docs/science.md §4.5) takes the AdamW slot:
        # same groups (weight decay on matrices, coupled L2 here), same lr schedule, same
        # state_dict key.
        adamw = (torch.optim.SGD(adam_groups, lr=cfg.lr, momentum=cfg.sgd_momentum)
                 if adam_groups else None)
    else:
        adamw = (torch.optim.AdamW(adam_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                   eps=cfg.eps, fused=fused or None) if adam_groups else None)
    muon = None
    if muon_groups:
        muon = Muon(
            muon_groups, lr=mu.lr, momentum=mu.momentum, nesterov=mu.nesterov,
            momentum_form=mu.momentum_form, msign=mu.msign, shape_scale=mu.shape_scale,
            dgram_retraction=mf.dgram_retraction,
            # the paper loop's msign is Muon's (NS5 is not a polar factor: Polar Express)
            dual=DualOptions(mode=mf.dual_mode, steps=mf.dual_steps, tol=mf.dual_tol,
                             lr=mf.dual_lr, warm_start=mf.dual_warm_start,
                             msign_method="polar_express" if mu.msign == "ns5" else mu.msign),
        )
    if muon is not None:
        _initial_retraction(muon, cfg)
    return Optimizers(adamw, muon, cfg.lr, mu.lr, managed)
