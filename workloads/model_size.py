"""A model's parameter count from its config alone (no torch, no model built), and a lower
bound on the memory its training needs: what lets a size typo (``model.n_embd=640000``) be
refused in one line before anything starts, rather than as an out-of-memory trial.

The counts are the weight matrices and embeddings of workloads/gpt.py, workloads/llama.py and
workloads/mlp.py; norms, biases and gains are left out, so the count is a slight undercount,
never an overcount: a refusal based on it is never wrong."""

from __future__ import annotations

from workloads.config import GPTConfig, MLPConfig, WorkloadConfig

__all__ = ["approx_params", "min_train_bytes"]

# fp32 values per parameter while training: the weight and its gradient, plus the optimizer's
# state (AdamW: 2 moments; Muon/SGD with momentum: 1; plain SGD: 0)
_STATE_COPIES = {"adamw": 2, "adam": 2, "muon": 1, "sgd": 1}


def approx_params(model: GPTConfig | MLPConfig) -> int:
    """Weight-matrix and embedding parameters (a vocab of 0, taken from the tokenizer at run
    time, counts as none)."""
    if isinstance(model, MLPConfig):
        w = model.width
        return model.d_in * w + max(model.depth - 1, 0) * w * w + w * model.n_classes
    d = model.n_embd
    if model.arch == "llama":
        ffn = model.ffn_hidden or (8 * d) // 3
        per_layer = 4 * d * d + 3 * d * ffn
    else:
        ffn = model.ffn_hidden or 4 * d
        per_layer = 4 * d * d + 2 * d * ffn
    pos = model.block_size * d if model.arch != "llama" else 0
    emb = model.vocab_size * d * (1 if model.tie_embeddings else 2)
    return model.n_layer * per_layer + pos + emb


def min_train_bytes(cfg: WorkloadConfig) -> int:
    """A lower bound on the bytes one training process holds: fp32 weights, gradients and the
    optimizer's state (activations, data and the framework itself come on top)."""
    copies = 2 + _STATE_COPIES.get(cfg.optim.name, 0)
    return 4 * copies * approx_params(cfg.model)
