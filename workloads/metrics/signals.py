"""Per-step health signals for the divergence monitor (``workloads.report.StepInfo``).

- ``param_max``: max |parameter| over the model, every step: fused ``_foreach_abs`` /
  ``_foreach_max`` and one host sync (~0.5 ms on gpt-debug on one CPU thread, ~2% of a step).
  The max, not the 2-norm, so huge but finite weights do not overflow into a false
  "non-finite parameter"; NaN propagates through the max.
- ``extras`` the monitor asked for (every ``signal_every`` steps, so the cost stays low):
  ``max_logit`` (max |q.k/sqrt(d_h)| over causal entries of every layer on the fixed probe
  batch, as ``inst.max_logit`` of the metrics collector; docs/science.md §3.5 item 3),
  ``sigma_max_q`` (max over layers of sigma_max(W_Q), §3.5 item 1) and ``update_ratio`` (max
  over matrices of ||W_{t+1} - W_t||_F / ||W_t||_F; needs ``before_step``).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor, nn

from workloads.metrics import instability as I

__all__ = ["StepSignals"]


class _Stop(Exception):
    pass


class StepSignals:
    def __init__(self, model: nn.Module, probe: Tensor | None = None) -> None:
        self.model, self.probe = model, probe
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.matrices = [p for p in self.params if p.dim() == 2]
        blocks = getattr(model, "blocks", None) or []
        self.attns = [b.attn for b in blocks if hasattr(getattr(b, "attn", None), "scores")]
        self._before: list[Tensor] | None = None

    @torch.no_grad()
    def param_max(self) -> float:
        return float(torch.stack(torch._foreach_max(torch._foreach_abs(self.params))).amax())

    @torch.no_grad()
    def before_step(self, wanted: Collection[str]) -> None:
        self._before = ([p.detach().clone() for p in self.matrices]
                        if "update_ratio" in wanted else None)

    @torch.no_grad()
    def extras(self, wanted: Collection[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        if "update_ratio" in wanted and self._before is not None:
            diff = torch._foreach_sub([p.detach() for p in self.matrices], self._before)
            num = torch.stack(torch._foreach_norm(diff))
            den = torch.stack(torch._foreach_norm(self._before)).clamp_min(1e-30)
            out["update_ratio"] = float((num / den).amax())
            self._before = None
        if "sigma_max_q" in wanted and self.attns:
            out["sigma_max_q"] = max(float(I.sigma_max(self._w_q(a))) for a in self.attns)
        if "max_logit" in wanted and self.attns and self.probe is not None:
            xs = self._probe_inputs()
            out["max_logit"] = max(float(I.logit_stats(a.scores(x))["max_abs"])
                                   for a, x in zip(self.attns, xs))
        return out

    @staticmethod
    def _w_q(attn: nn.Module) -> Tensor:
        if hasattr(attn, "c_attn"):  # GPT: fused rows [Q; K; V]
            return I.split_qkv(attn.c_attn.weight)[0]
        return attn.q.weight  # Llama

    def _probe_inputs(self) -> list[Tensor]:
        """Each attention's input x (B, T, C) on the probe batch; the forward stops after the
        last one (the same capture as MetricsCollector's, which needs a collector instance)."""
        captured: dict[int, Tensor] = {}

        def hook(i: int):
            def fn(_mod, args, kwargs):
                captured.setdefault(i, args[0] if args else kwargs["x"])
                if i == len(self.attns) - 1:
                    raise _Stop
            return fn

        handles = [a.register_forward_pre_hook(hook(i), with_kwargs=True)
                   for i, a in enumerate(self.attns)]
        was_training = self.model.training
        try:
            self.model.eval()
            self.model(self.probe)
        except _Stop:
            pass
        finally:
            self.model.train(was_training)
            for h in handles:
                h.remove()
        return [captured[i] for i in range(len(self.attns))]
