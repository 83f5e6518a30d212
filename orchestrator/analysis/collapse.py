"""The collapse ceiling of a family x lr sweep: the loss at or above which a trial counts as
unstable although it completed (docs/science.md §2, [DESIGN]).

With AdamW and gradient clipping a too-large learning rate rarely produces a non-finite loss:
the run blows up, collapses to predicting token frequencies, and stays there with a finite loss
that the divergence rules do not flag. The reference is the corpus's context-free loss (the
val cross-entropy of the training split's token frequencies, workloads/data/reference.py); the
ceiling is ``(1 - MARGIN)`` times it, so that a run at the plateau plus evaluation noise
(about 0.06 nats for a 512-token val estimate) is not counted as trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARGIN", "Ceiling", "collapse_ceiling"]

MARGIN = 0.05  # 5% below the plateau: ~0.17 nats on char Shakespeare, ~3 SE of its val loss


@dataclass(frozen=True)
class Ceiling:
    value: float  # nan: no ceiling (the old rule: completed with a finite loss)
    reference: float  # the context-free loss, nan when unknown
    note: str  # how it was obtained, or why there is none


def collapse_ceiling(root: str | Path, margin: float = MARGIN) -> Ceiling:
    """The ceiling of the sweep in ``root`` (its ``spec.yaml``): one corpus for every trial
    (a space over ``data.*`` gets none), a token corpus (a GPT workload)."""
    nan = math.nan
    f = Path(root) / "spec.yaml"
    if not f.is_file():
        return Ceiling(nan, nan, "no spec.yaml: stable = completed with a finite loss")
    try:
        from orchestrator.spec.yaml_reader import load_spec

        spec = load_spec(f)
        if any(k.startswith("data.") for k in spec.space):
            return Ceiling(nan, nan, "the space varies the data: no common context-free loss")
        cfg = spec.base_config()
        if not hasattr(cfg.data, "tokenizer"):
            return Ceiling(nan, nan, "not a token corpus: no context-free loss")
        from workloads.data.reference import context_free_loss

        ref = context_free_loss(cfg.data)
    except Exception as e:  # the report goes on with the old rule, and says why
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Ceiling(nan, nan, f"context-free loss unavailable ({first})")
    return Ceiling(ref * (1 - margin), ref,
                   f"context-free loss {ref:.4g} ({cfg.data.corpus}, {cfg.data.tokenizer}); "
                   f"ceiling {ref * (1 - margin):.4g} = {1 - margin:g} x it")
