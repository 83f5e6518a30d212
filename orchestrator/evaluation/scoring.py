"""Held-out evaluation of a trained model on a fixed list of batches: loss, perplexity, accuracy.

An ``EvalSet`` is a named list of (x, y) batches fixed in advance (no sampling), so two
evaluations of the same weights give the same numbers. Targets ``-1`` are not scored.

- ``lm``: next-token prediction; ``loss`` = mean cross-entropy per scored token (nats),
  ``ppl = exp(loss)``, ``acc`` = top-1 next-token accuracy, ``tokens`` = scored tokens.
- ``last_word`` (LAMBADA): only the last word's tokens are scored; ``loss``/``ppl`` over those
  tokens, ``acc`` = fraction of examples whose every last-word token is the greedy argmax,
  ``tokens`` = scored tokens, ``examples`` = examples.
- ``classify`` (MNIST): ``loss`` = mean cross-entropy per sample, ``acc``, ``samples``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EvalSet", "KINDS", "evaluate"]

KINDS = ("lm", "last_word", "classify")


@dataclass
class EvalSet:
    key: str  # corpus key in metric names: eval/<key>/loss
    kind: str  # lm | last_word | classify
    batches: list[tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    source: str = ""  # where the text came from, for the terminal and the Parquet rows

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: use one of {', '.join(KINDS)}")


@torch.no_grad()
def evaluate(model: nn.Module, es: EvalSet, device: torch.device | str = "cpu") -> dict[str, float]:
    """Metrics of ``model`` on ``es`` (model put in eval mode; fp32 logits)."""
    model.eval()
    loss_sum = 0.0  # float64 accumulation over batches
    n_scored = correct = examples = 0
    for x, y in es.batches:
        x, y = x.to(device), y.to(device)
        logits, _ = model(x)
        logits = logits.float()
        if es.kind == "classify":  # (B, n_classes)
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
            n_scored += len(y)
            continue
        flat = logits.view(-1, logits.size(-1))  # (B*T, V)
        loss_sum += float(F.cross_entropy(flat, y.reshape(-1), ignore_index=-1, reduction="sum"))
        scored = y != -1  # (B, T)
        hit = (logits.argmax(-1) == y) & scored
        n_scored += int(scored.sum())
        if es.kind == "lm":
            correct += int(hit.sum())
        else:  # last word: every scored token of the example right
            has = scored.any(dim=1)
            correct += int(((hit | ~scored).all(dim=1) & has).sum())
            examples += int(has.sum())
    if n_scored == 0:
        raise ValueError(f"eval set {es.key!r}: nothing to score")
    loss = loss_sum / n_scored
    if es.kind == "classify":
        return {"loss": loss, "acc": correct / n_scored, "samples": float(n_scored)}
    ppl = math.exp(loss) if loss < 700 else math.inf  # exp overflows above ~709
    out = {"loss": loss, "ppl": ppl, "tokens": float(n_scored)}
    if es.kind == "lm":
        out["acc"] = correct / n_scored
    else:
        out["acc"] = correct / max(1, examples)
        out["examples"] = float(examples)
    return out
