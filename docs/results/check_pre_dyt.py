"""Why Pre-DyT sat at the frequency plateau in `norm_ablation` (docs/results.md §0b).

Trains the norm_ablation arm (gpt-debug, 6 layers, wd 0, warm-up 50, cosine, 1000 steps, seed 0)
at lr 1e-3, with tied embeddings (the preset's) and untied (as in DyT's LLaMA recipe), and
prints the training loss, the stream norm after the last sublayer, and the share of the final
DyT's inputs in tanh's flat tail (|alpha x| > 2, where tanh' < 0.07): once the stream is large
the final DyT saturates and almost no gradient passes it. Pre-LN is printed for scale.

Run from the repository root: PYTHONPATH=. .venv/bin/python docs/results/check_pre_dyt.py
(3 x 1000 steps, one thread: about a minute on a quiet core).
"""

import torch

from workloads.config import apply_overrides, preset
from workloads.models import build_model
from workloads.optim import build_optimizers
from workloads.schedule import lr_at
from workloads.train import build_data
from workloads.validate import validate

ARMS = (("pre_dyt, tied", "pre_dyt", True), ("pre_dyt, untied", "pre_dyt", False),
        ("pre_ln, tied", "pre_ln", True))
STEPS, LR, EVERY = 1000, 1e-3, 100


def _arm(family: str, tied: bool) -> None:
    cfg = validate(apply_overrides(preset("gpt-debug"), {
        "model.n_layer": 6, "model.residual": {"family": family},
        "model.tie_embeddings": tied, "optim.weight_decay": 0.0, "optim.warmup_steps": 50,
        "optim.lr": LR, "train.steps": STEPS, "train.seed": 0}))
    torch.manual_seed(0)
    data = build_data(cfg)
    model = build_model(cfg.model, vocab_size=data.vocab_size)
    opts = build_optimizers(model, cfg.optim)
    stream, last = model.stream, 2 * cfg.model.n_layer - 1
    seen: dict[str, torch.Tensor] = {}
    # the final norm's input, to measure how much of it lies in tanh's flat tail
    stream.ln_f.register_forward_hook(lambda _m, args, _out: seen.__setitem__("x", args[0]))
    window: list[float] = []
    for step in range(STEPS):
        opts.set_lr(lr_at(step, LR, STEPS, cfg.optim.warmup_steps, cfg.optim.schedule,
                          cfg.optim.min_lr_ratio))
        x, y = data.batcher.next()
        stream.record_stats = step % EVERY == 0 or step == STEPS - 1
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opts.step()
        opts.zero_grad()
        window.append(loss.item())
        if stream.record_stats:
            h_norm = stream.stats()[f"h_norm/{last}"]
            sat = "-"
            if family == "pre_dyt":
                a = float(stream.ln_f.alpha)
                sat = f"{float((seen['x'] * a).abs().gt(2).float().mean()):.2f}"
            print(f"{step:5d} | {sum(window) / len(window):6.3f} | {h_norm:8.2f} | {sat:>5}",
                  flush=True)
            window = []


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name, family, tied in ARMS:
        print(f"\n{name} (lr {LR:g}): step | mean train loss since last row | ||h|| after the "
              f"last sublayer | share of final-DyT inputs with |alpha x| > 2")
        _arm(family, tied)
