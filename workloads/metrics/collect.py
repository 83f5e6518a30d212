"""``MetricsCollector``: continuity (SCIENCE 4.3) and instability (3.5) metrics during training.

The loop calls ``after_backward(step)`` after every backward (grads final, before the optimizer
step) and ``collect(step, exact_svd)`` every ``train.metrics_every`` steps (grads may already be
zeroed: everything gradient-based is taken in ``after_backward``). ``collect`` returns tidy rows
(docs/contracts.md) and a few summary scalars.

Matrices of one role are stacked over layers, (L, m, n), so each metric is one batched call.
GPT's fused ``c_attn`` (rows [Q; K; V]) is split into roles q, k, v; io matrices are skipped.

Row names (``metric``); pair rows have ``next_layer = layer + 1``, per-layer rows ``-1``:
- ``{src}.top1_{v|u}``  M1 |cos| of the top singular vectors, src in w (weights), dw (W - W0),
  cg (cumulative gradient); ``base.top1_{v|u}`` the random baseline sqrt(2/(pi n)).
  ``RESIDUAL_SIDES[role]`` says which side is the residual stream (the rest is the control).
- ``{src}.sub{k}_{v|u}``  M2 top-k overlap (k < min(m, n)); ``base.sub{k}_{v|u}`` = k/n.
- ``{src}.gram_{in|out}`` and ``..._c`` (isotropy-centred)  M3.
- ``g.coh`` (last step) and ``g.coh_mean`` (mean since the previous collect)  M5 instantaneous,
  the *signed* Frobenius cosine; ``cg.coh``, ``dw.coh`` cumulative / update coherence. The first
  collect also returns ``g.coh`` rows at step 0 (coherence at initialisation).
- ``gp.top1_{v|u}`` gradient continuity as Paper C measures it: M1 of the top singular vectors
  of G_l = dL/dW_l on ``grad_probes`` fixed batches, |cos| averaged over the batches;
  ``gp.s1_s2`` (per layer, mean over batches) says whether those vectors are well defined,
  ``gp.loss`` (model-wide) the mean probe loss, ``gp.ritz_res`` the cheap path's residual.
- ``{w|gp}.dist_top1_{v|u}`` M1 at layer distance d in 1, 2, 5, 10 (``next_layer = layer + d``;
  d = 1 repeats ``top1``): real continuity decays with d. ``{w|gp}.ones_{v|u}`` (per layer)
  |cos| of the top vector with the all-ones direction, the NoRes artefact control (§4.5).
- ``wc.*`` / ``gpc.*`` (``metrics.centred``): the same M1 rows (``top1``, ``dist_top1``,
  ``s1_s2``) on the doubly centred weights / probe gradients, blind to the all-ones direction
  (workloads/metrics/centred.py).
- ``w.self_{v|u}`` M7 |cos| of a layer's top vector with its own at the previous collect;
  ``w.self0_{v|u}`` the same against init. All |cos| rows share ``base.top1``'s baseline.
- ``act.stream_norm`` (module "", layer l = 0..depth: mean ||h_l|| on the probe batch) and
  ``act.stream_growth`` (||h_L|| / ||h_0||), for models with ``stream_norms(x)`` (the MLP).
- per layer: ``w.s1_s2``, ``w.sigma_max``, ``w.fro``, ``w.sigma_growth`` (s1 / s1 at init),
  ``w.rel_change_fro``, ``w.rel_change_spec`` (M6), ``w.ritz_res`` (cheap path only).
- ``inst.*`` (module ``attn``, per layer): ``kappa_max``, ``kappa_rope_max``, ``max_logit``,
  ``logit_rms``, ``row_range``, ``sat_0p9``, ``sat_0p99``, ``entropy_mean``, ``entropy_min``,
  ``jacobian_fro``; per managed matrix (module = its role, ``qkv`` fused):
  ``stiefel_viol``, ``dgram_viol``, ``colnorm_spread``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn

from workloads.metrics import continuity as C
from workloads.metrics import instability as I
from workloads.metrics import probe as P
from workloads.metrics.centred import centred_rows
from workloads.metrics.collect_groups import STACKED_ROLES, _build_groups, _Group
from workloads.metrics.collect_inst import instability_rows
from workloads.metrics.summary import RESIDUAL_SIDES, summarize

__all__ = ["MetricsCollector", "RESIDUAL_SIDES", "STACKED_ROLES"]

_SOURCES = ("w", "dw", "cg")


def _baselines(n_pairs: int, ks: list[int], m: int, n: int) -> list[tuple[str, Tensor]]:
    """Random baselines of the pair rows: base.top1_{v|u} and base.sub{k}_{v|u}."""
    one = torch.ones(n_pairs)
    rows = [("base.top1_v", one * C.random_baseline_top1(n)),
            ("base.top1_u", one * C.random_baseline_top1(m))]
    for k in ks:
        rows.append((f"base.sub{k}_v", one * C.random_baseline_subspace(k, n)))
        rows.append((f"base.sub{k}_u", one * C.random_baseline_subspace(k, m)))
    return rows


class MetricsCollector:
    """Continuity and instability metrics of one model; see the module docstring for names."""

    warm_iters = 6  # subspace iterations of the cheap path from the previous collect's vectors

    def __init__(self, model: nn.Module, metrics_cfg: Any, probe_batch: Tensor | None = None,
                 optimizers: Any = None,
                 grad_probes: list[tuple[Tensor, Tensor]] | None = None) -> None:
        self.model, self.cfg, self.probe = model, metrics_cfg, probe_batch
        self.grad_probes = list(grad_probes or [])  # fixed (x, y) batches for gp.*
        self.optimizers = optimizers
        self.roles = list(model.matrix_roles())
        self.groups = [g for g in _build_groups(self.roles) if len(g.params) > 0]
        self.coherence = bool(getattr(metrics_cfg, "coherence", True))
        self.instability = bool(getattr(metrics_cfg, "instability", True))
        self.centred = bool(getattr(metrics_cfg, "centred", False))
        self.topk = sorted({int(k) for k in getattr(metrics_cfg, "topk", [1, 4, 16]) if k >= 1})
        with torch.no_grad():
            self.W0 = {g.label: g.weights() for g in self.groups}
            self.sigma0 = {lab: I.sigma_max(w) for lab, w in self.W0.items()}
        self.cum = {g.label: torch.zeros_like(self.W0[g.label]) for g in self.groups}
        self.warm: dict[str, Tensor] = {}
        self._views: dict[str, list[Tensor]] = {}
        self._sigma: dict[str, Tensor] = {}  # label -> (L,) s1 of the weights, last collect
        self.coh_last: dict[str, Tensor] = {}
        self.coh_sum: dict[str, Tensor] = {}
        self.coh_init: dict[str, Tensor] | None = None
        self.coh_count = 0
        self.n_backward = 0
        self._gen = torch.Generator().manual_seed(0)
        self.prev_top: dict[str, dict[str, Tensor]] = {}  # label -> side -> (L, dim), M7
        self.top0: dict[str, dict[str, Tensor]] = {}  # the same at init
        self.scalars0: dict[str, float] = {}  # init_rows()'s summary, as cont0/*

    # --- every step ----------------------------------------------------------------------

    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        """Accumulate C_l += G_l and the instantaneous coherence cos_F(G_l, G_l+1) (M5, k = 1).

        O(params) with no copies and no device sync: one fused add and one fused norm over
        every tracked gradient, and one dot product per adjacent pair.
        """
        if not self.coherence:
            return
        views: list[Tensor] = []
        grads: list[Tensor] = []
        spans: list[tuple[_Group, int]] = []
        for g in self.groups:
            gr = g.grads()
            if gr is None:
                continue
            spans.append((g, len(grads)))
            views += self._cum_views(g.label)
            grads += [x if x.dtype == torch.float32 else x.float() for x in gr]
        if not grads:
            return
        torch._foreach_add_(views, grads)
        norms = torch._foreach_norm(grads)
        for g, start in spans:
            L = len(g.params)
            if L < 2:
                continue
            gr = grads[start:start + L]
            dots = torch.stack([torch.dot(gr[i].reshape(-1), gr[i + 1].reshape(-1))
                                for i in range(L - 1)])
            nrm = torch.stack(norms[start:start + L])
            coh = dots / (nrm[:-1] * nrm[1:]).clamp_min(1e-30)  # (L-1,), on device: no sync
            self.coh_last[g.label] = coh
            self.coh_sum[g.label] = self.coh_sum.get(g.label, 0) + coh
        self.coh_count += 1
        if self.n_backward == 0 and step == 0:
            self.coh_init = {k: v.clone() for k, v in self.coh_last.items()}
        self.n_backward += 1

    def _cum_views(self, label: str) -> list[Tensor]:
        """Per-layer views of the (L, m, n) cumulative-gradient buffer (rebuilt after a load)."""
        buf = self.cum[label]
        views = self._views.get(label)
        if views is None or views[0]._base is not buf:
            views = self._views[label] = list(buf.unbind(0))
        return views

    # --- every metrics_every steps -------------------------------------------------------

    @torch.no_grad()
    def collect(self, step: int, exact_svd: bool = True) -> tuple[list[dict], dict[str, float]]:
        """Rows and summary scalars at ``step``; M1/M2 by exact batched SVD or, when
        ``exact_svd`` is False, by warm-started subspace iteration (SCIENCE 4.4.3)."""
        t0 = time.perf_counter()
        out: list[tuple[str, str, list[int], bool, Tensor]] = []  # values aligned to layers
        for g in self.groups:
            self._continuity(g, exact_svd, out)
        self._gradient_probe(out, exact_svd)
        self._stream(out)
        rows = self._rows(step, out)
        if self.coh_init is not None and step != 0:  # at step 0 the rows above are these
            init: list = []
            self._coherence_rows(self.coh_init, None, init)
            rows += self._rows(0, init)
        self.coh_init = None
        inst_rows, inst_scalars = self._instability(step) if self.instability else ([], {})
        rows += inst_rows
        self.coh_sum, self.coh_count = {}, 0
        scalars = summarize(rows, step)
        scalars.update(self.scalars0)
        scalars.update(inst_scalars)
        scalars["cont/svd_exact"] = float(exact_svd)
        stats = getattr(self.optimizers, "stats", None)
        if callable(stats):
            scalars.update({f"optim/{k}": float(v) for k, v in stats().items()})
        dual_rows = getattr(self.optimizers, "dual_rows", None)  # optim/dual_* per matrix
        rows += dual_rows(step) if callable(dual_rows) else []
        scalars["metrics/time_s"] = time.perf_counter() - t0
        return rows, scalars

    def _continuity(self, g: _Group, exact: bool, out: list) -> None:
        W = g.weights()  # (L, m, n)
        L, m, n = W.shape
        pairs = g.pairs()
        a, b = pairs, [i + 1 for i in pairs]  # stack indices of the pair members
        lay = [g.layers[i] for i in pairs]

        def pair(name: str, values: Tensor) -> None:
            if pairs:
                out.append((name, g.label, lay, True, values))

        def layer(name: str, values: Tensor) -> None:
            out.append((name, g.label, list(g.layers), False, values))

        ks = [k for k in self.topk if k < min(m, n)]
        kk = min(max([2, *ks]), min(m, n))
        sources = {"w": W, "dw": W - self.W0[g.label]}
        if self.coherence:
            sources["cg"] = self.cum[g.label]
        for src, X in sources.items():
            if src != "w" and not bool((X != 0).any()):
                continue  # no update / no gradient yet: singular vectors undefined
            U, S, V, res = C.top_k_warm(X, kk, exact, self.warm, f"{src}.{g.label}",
                                        self._gen, self.warm_iters)
            if res is not None and src == "w":
                layer("w.ritz_res", res.amax(-1))
            if pairs:
                for side, Y in (("v", V), ("u", U)):
                    # (P, kk, kk) cosines between adjacent layers' singular vectors: M1 is
                    # |M_00| (C.top1_continuity), M2 is ||M[:k, :k]||^2 / k (C.subspace_overlap)
                    M = Y[a].mT @ Y[b]
                    pair(f"{src}.top1_{side}", M[:, 0, 0].abs())
                    for k in ks:
                        pair(f"{src}.sub{k}_{side}", M[:, :k, :k].pow(2).sum((-2, -1)) / k)
                for name, vals in C.gram_alignment_adjacent(X).items():
                    pair(f"{src}.gram_{name}", vals[a])
                if src != "w":
                    pair(f"{src}.coh", C.cosine_frobenius(X[a], X[b]))
            if src == "w":
                self._weight_rows(g, W, U, S, V, out)
            if src == "dw":
                layer("w.rel_change_spec", S[:, 0] / self.sigma0[g.label])
        if self.centred:
            out += centred_rows("wc", g.label, g.layers, W, exact, self.warm, self._gen,
                                self.warm_iters)
        if pairs:
            out.extend((name, g.label, lay, True, v)
                       for name, v in _baselines(len(pairs), ks, m, n))
        self._coherence_rows(self.coh_last, self.coh_sum, out, only=g)

    def _weight_rows(self, g: _Group, W: Tensor, U: Tensor, S: Tensor, V: Tensor,
                     out: list) -> None:
        """Per-layer rows of the weights' own SVD: top vectors, M7, sigma, s1/s2, norms, M6."""
        def layer(name: str, values: Tensor) -> None:
            out.append((name, g.label, list(g.layers), False, values))

        top = {"v": V[..., 0], "u": U[..., 0]}  # (L, dim)
        out.extend(P.vector_rows("w", g.label, g.layers,
                                 {k: y[None] for k, y in top.items()}, adjacent=False))
        self._self_alignment(g, top, out)
        self._sigma[g.label] = S[:, 0]
        layer("w.sigma_max", S[:, 0])
        layer("w.s1_s2", S[:, 0] / S[:, 1].clamp_min(1e-30))
        layer("w.fro", W.norm(dim=(-2, -1)))
        layer("w.sigma_growth", S[:, 0] / self.sigma0[g.label])
        layer("w.rel_change_fro", C.relative_change(W, self.W0[g.label], False)[0])

    def _self_alignment(self, g: _Group, top: dict[str, Tensor], out: list) -> None:
        """M7 against the previous collect (w.self_*) and against init (w.self0_*)."""
        if g.label not in self.top0:
            U0, _, V0 = C.top_singular(self.W0[g.label], 1)
            self.top0[g.label] = {"v": V0[..., 0], "u": U0[..., 0]}
        for name, ref in (("self", self.prev_top.get(g.label)), ("self0", self.top0[g.label])):
            if ref is not None:
                for side, y in top.items():
                    out.append((f"w.{name}_{side}", g.label, list(g.layers), False,
                                C.top1_continuity(y, ref[side])))
        self.prev_top[g.label] = {k: y.clone() for k, y in top.items()}

    def _gradient_probe(self, out: list, exact: bool) -> None:
        """gp.*: top-1 singular vectors of G_l on every probe batch, batched over (P, L, m, n)
        per role, M1 averaged over the batches (§4.3 M5, Paper C's form). Exact SVD, or
        subspace iteration warm-started from the previous collect's vectors (``gp.ritz_res``)."""
        if not self.grad_probes:
            return
        params = list({id(p): p for g in self.groups for p in g.params}.values())
        index = {id(p): i for i, p in enumerate(params)}
        grads, losses = P.probe_gradients(self.model, params, self.grad_probes)
        out.append(("gp.loss", "", [-1], False, losses.mean().reshape(1)))
        for g in self.groups:
            per_batch = [[gs[index[id(p)]] for p in g.params] for gs in grads]
            if any(x is None for b in per_batch for x in b):
                continue
            G = torch.stack([torch.stack([C.as_float(g._cut(x)) for x in b]) for b in per_batch])
            # (P, L, m | n, 2), (P, L, 2); a new probe gradient: 30 iterations even when warm
            U, S, V, res = C.top_k_warm(G, 2, exact, self.warm, f"gp.{g.label}", self._gen)
            if res is not None:
                out.append(("gp.ritz_res", g.label, list(g.layers), False, res.amax(-1).amax(0)))
            out.extend(P.vector_rows("gp", g.label, g.layers,
                                     {"v": V[..., 0], "u": U[..., 0]}, adjacent=True))
            out.append(("gp.s1_s2", g.label, list(g.layers), False,
                        (S[..., 0] / S[..., 1].clamp_min(1e-30)).mean(0)))
            if self.centred:
                out += centred_rows("gpc", g.label, g.layers, G, exact, self.warm, self._gen)

    def _stream(self, out: list) -> None:
        """act.stream_norm / act.stream_growth on the probe batch (models with stream_norms)."""
        fn = getattr(self.model, "stream_norms", None)
        x = self.probe if self.probe is not None else (
            self.grad_probes[0][0] if self.grad_probes else None)
        if fn is None or x is None:
            return
        norms = fn(x).float()
        out.append(("act.stream_norm", "", list(range(len(norms))), False, norms))
        out.append(("act.stream_growth", "", [-1], False, (norms[-1] / norms[0]).reshape(1)))

    def init_rows(self) -> list[dict]:
        """Every metric at step 0 (call before the first optimizer step; the loop does): rows
        of step 0, and the summary scalars kept as ``cont0/*`` in every later ``collect``."""
        rows, scalars = self.collect(0, exact_svd=True)
        self.scalars0 = {"cont0/" + k[5:]: v for k, v in scalars.items()
                         if k.startswith("cont/") and k != "cont/svd_exact"}
        return rows

    def _coherence_rows(self, last: dict, total: dict | None, out: list,
                        only: _Group | None = None) -> None:
        for g in self.groups if only is None else [only]:
            if g.label not in last:
                continue
            pairs = g.pairs()
            lay = [g.layers[i] for i in pairs]
            out.append(("g.coh", g.label, lay, True, last[g.label][pairs]))
            if total is not None and g.label in total and self.coh_count:
                mean = total[g.label][pairs] / self.coh_count
                out.append(("g.coh_mean", g.label, lay, True, mean))

    @staticmethod
    def _rows(step: int, out: list) -> list[dict]:
        rows = []
        for metric, module, layers, pair, values in out:
            for layer, v in zip(layers, values.detach().float().cpu().tolist()):
                # pair: True (adjacent), an int layer distance d, or False (per layer)
                rows.append({"step": step, "metric": metric, "module": module, "layer": layer,
                             "next_layer": layer + int(pair) if pair else -1,
                             "value": float(v)})
        return rows

    # --- instability (SCIENCE 3.5): the rows come from workloads/metrics/collect_inst.py ---

    def _instability(self, step: int) -> tuple[list[dict], dict[str, float]]:
        out, scalars = instability_rows(self.model, self.roles, self.groups, self._sigma,
                                        self.probe)
        return self._rows(step, out), scalars

    # --- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"W0": self.W0, "sigma0": self.sigma0, "cum": self.cum, "warm": self.warm,
                "coh_last": self.coh_last, "coh_sum": self.coh_sum, "coh_count": self.coh_count,
                "coh_init": self.coh_init, "n_backward": self.n_backward,
                "prev_top": dict(self.prev_top), "top0": dict(self.top0),
                "scalars0": dict(self.scalars0)}

    def load_state_dict(self, state: dict) -> None:
        device = next(iter(self.W0.values())).device if self.W0 else torch.device("cpu")

        def move(d: dict) -> dict:
            return {k: v.to(device) for k, v in d.items()}

        self.W0, self.sigma0 = move(state["W0"]), move(state["sigma0"])
        self.cum = move(state["cum"])
        self.warm, self.coh_last = move(state["warm"]), move(state["coh_last"])
        self.coh_sum = move(state["coh_sum"])
        self.coh_count, self.n_backward = state["coh_count"], state["n_backward"]
        init = state.get("coh_init")
        self.coh_init = move(init) if init is not None else None
        self.prev_top = {k: move(v) for k, v in state.get("prev_top", {}).items()}
        self.top0 = {k: move(v) for k, v in state.get("top0", {}).items()}
        self.scalars0 = dict(state.get("scalars0", {}))
