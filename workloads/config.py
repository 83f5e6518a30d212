"""Workload configuration: small dataclasses of plain values plus named presets.

One name per concept: the dotted path of a field (``model.residual.p``) is at once the spec key,
the MLflow param, the Parquet column and the plot axis. ``flatten(cfg)`` produces those keys.

A residual family's own parameters live under it (``model.residual = {"family": "spheret",
"p": 1.0}``); the family registry in ``workloads.residual`` validates them. This module is a leaf
(it imports nothing of ``workloads``): ``workloads.validate`` checks a config against the
registries.
"""

# Over ~400 lines on purpose: this module must stay a leaf (docs/contracts.md) and keep
# exporting the dataclasses, the presets and the override helpers; moving any of them to a
# sibling module would make config.py import it. The parts are sectioned below.

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConfigError",
    "GPTConfig",
    "MLPConfig",
    "DataConfig",
    "MuonConfig",
    "ManifoldConfig",
    "OptimConfig",
    "TrainConfig",
    "MetricsConfig",
    "WorkloadConfig",
    "PRESETS",
    "preset",
    "apply_overrides",
    "flatten",
    "to_dict",
    "from_dict",
    "parse_value",
    "parse_p",
    "INF_SPELLINGS",
]


class ConfigError(ValueError):
    """A user-facing configuration error; its message is one line naming the bad field."""


# --- model -------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    """A GPT-2 style (``arch="gpt"``) or Llama-style (``arch="llama"``) decoder."""

    arch: str = "gpt"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    vocab_size: int = 0  # 0: taken from the tokenizer (GPT-2 BPE pads 50257 -> 50304)
    bias: bool = False
    dropout: float = 0.0
    ffn_hidden: int = 0  # 0: 4d for gpt, 8d/3 rounded up to a multiple of 64 for llama
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    residual: dict = field(default_factory=lambda: {"family": "pre_ln"})


@dataclass
class MLPConfig:
    """The residual MLP of docs/science.md §4.5: d_in -> width -> depth x (width^2) -> classes."""

    arch: str = "mlp"
    d_in: int = 784
    width: int = 256
    depth: int = 16
    n_classes: int = 10
    skip: bool = True  # the residual connection (False: the NoRes arm)
    activation: str = "relu"  # relu | gelu | silu | none | radial | radial_rms | tanh
    norm: str = "none"  # none | layernorm | rmsnorm  (applied to the block input)
    # hidden W ~ N(0, (init_scale * c)^2 / width): c = 1/sqrt(depth) with the skip, the He-style
    # gain of the activation without it (init "depth_scaled"), or c = 1 (init "fan_in", the
    # pre-fix init whose stream grows ~2^depth/2-fold); so init_scale is relative to the default
    init: str = "depth_scaled"  # depth_scaled | fan_in
    init_scale: float = 1.0


ModelConfig = GPTConfig | MLPConfig


# --- data --------------------------------------------------------------------------------


@dataclass
class DataConfig:
    # shakespeare | mnist | openwebtext | fineweb-edu | wikitext-103 | a local .txt/.parquet path
    corpus: str = "shakespeare"
    tokenizer: str = "gpt2"  # gpt2 | char
    val_fraction: float = 0.1
    max_tokens: int = 0  # 0: the whole corpus; else truncate (cache key includes it)
    cache_dir: str = ""  # "": $GEOSWEEP_CACHE or ~/.cache/geosweep


# --- optimisation ------------------------------------------------------------------------


@dataclass
class MuonConfig:
    """Muon for the hidden matrices; docs/science.md §3.1. Defaults are Paper B's form."""

    lr: float = 0.02  # follows the AdamW schedule: lr_t * muon.lr / optim.lr
    momentum: float = 0.95
    nesterov: bool = True
    momentum_form: str = "sum"  # sum (Paper B) | ema (Keller Jordan)
    msign: str = "polar_express"  # polar_express | ns5 | svd
    weight_decay: float = 0.1  # only for unconstrained matrices
    shape_scale: bool = False  # sqrt(max(1, m/n)) as in Keller's Muon


@dataclass
class ManifoldConfig:
    """Which constraint each Muon-managed matrix lives on; docs/science.md §3.2-3.4."""

    # unconstrained | all_stiefel | all_dgram | hetero | hetero_inv, or {module-pattern: constraint}
    assignment: Any = "unconstrained"
    # fast | paper | exact: the direction solver, named by what it promises (docs/science.md
    # §3.2): fast (default) fp32 Gram-space Newton to dual_tol; paper, Paper B's ascent
    # exactly (K = dual_steps passes, alpha = dual_lr, fresh start); exact, fp64 Newton
    dual_mode: str = "fast"
    # the pass cap (paper: K); None: the mode's own (fast and paper 20, exact 100)
    dual_steps: int | None = None
    dual_lr: float = 0.1  # the paper mode's alpha (Paper B: 0.1)
    # stop once the true residual ||P(W^T A + A^T W)||_F / n < tol; None: the mode's own
    # (fast 1e-4, paper and exact 1e-6)
    dual_tol: float | None = None
    # start each step's dual from the previous step's multiplier; None: the mode's own (fast
    # and exact yes; paper no, as the paper: on, it is the paper's loop warm-started)
    dual_warm_start: bool | None = None
    dgram_retraction: str = "paper_svd_sorted"  # paper_svd_sorted | colnorm_polar
    init_on_manifold: bool = True
    # Matched initial scales across assignments: every Muon-managed matrix, the unconstrained
    # arm's too, is first retracted onto Stiefel (all singular values 1), so every assignment
    # starts from the same matrices. Without it the constrained arms' retraction multiplies a
    # nanoGPT init's singular values (~0.1-0.4 at std 0.02) by 3-10x and the unconstrained
    # arm starts at another scale (docs/science.md §3.4).
    init_match: bool = False


@dataclass
class OptimConfig:
    # adamw | muon | sgd  (muon: hidden matrices on Muon/Manifold Muon, rest AdamW; sgd: SGD with
    # momentum for everything, the rotation-equivariant control of docs/science.md §4.5)
    name: str = "adamw"
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95  # 0 is allowed: Adam's step becomes m_hat / (|g| + eps), sign-like
    sgd_momentum: float = 0.9  # sgd only (heavy ball, dampening 0)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 20
    schedule: str = "cosine"  # cosine | constant
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables
    muon: MuonConfig = field(default_factory=MuonConfig)
    manifold: ManifoldConfig = field(default_factory=ManifoldConfig)


# --- the loop ----------------------------------------------------------------------------


@dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 12
    grad_accum: int = 1
    eval_every: int = 50  # also the report interval
    eval_iters: int = 10
    metrics_every: int = 50  # continuity/instability metrics; 0 disables
    # the per-step train curve (loss, grad_norm, lr) every k steps and at every report; 0: at
    # reports only (the divergence monitor sees every step whatever it is)
    curve_every: int = 1
    checkpoint_every: int = 0  # 0: only at the end when a checkpoint dir is given
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "float32"  # float32 | bf16 (autocast; retractions stay fp32)
    compile: bool = False
    epochs: int = 0  # mlp only: when > 0, steps = epochs * ceil(n_train / batch_size)


@dataclass
class MetricsConfig:
    svd_every: int = 0  # exact batched SVD metrics every k steps; 0: every metrics_every
    topk: list = field(default_factory=lambda: [1, 4, 16])
    probe_batch: int = 4
    probe_len: int = 0  # 0: block_size (capped at 256)
    coherence: bool = True  # gradient coherence (instantaneous and cumulative)
    # fixed validation batches for gradient continuity (gp.*, Paper C's M1 on dL/dW_l) at step 0
    # and every metrics step: one forward/backward and one batched SVD each; 0 turns it off
    grad_probes: int = 0
    instability: bool = True
    # the all-ones-blind M1 (wc.*, and gpc.* with grad_probes): top vectors of the doubly
    # centred matrices, one more batched SVD per role (docs/science.md §4.5); off by default
    centred: bool = False


@dataclass
class WorkloadConfig:
    preset: str = ""
    model: Any = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


# --- presets (functions; variants copy and edit a base) -----------------------------------


def gpt_debug() -> WorkloadConfig:
    """Trains in seconds on CPU: char-level Shakespeare, 2 x 64."""
    return WorkloadConfig(
        preset="gpt-debug",
        model=GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32),
        data=DataConfig(corpus="shakespeare", tokenizer="char", max_tokens=200_000),
        optim=OptimConfig(lr=3e-3, warmup_steps=5),
        train=TrainConfig(steps=30, batch_size=8, eval_every=10, eval_iters=2, metrics_every=10),
    )


def gpt_tiny() -> WorkloadConfig:
    """nanoGPT's CPU recipe (docs/science.md §1.2 Tiny-A) on GPT-2 BPE Shakespeare."""
    return WorkloadConfig(
        preset="gpt-tiny",
        model=GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64),
        data=DataConfig(corpus="shakespeare", tokenizer="gpt2"),
        optim=OptimConfig(lr=1e-3, beta2=0.99, warmup_steps=100),
        train=TrainConfig(steps=500, batch_size=12, eval_every=100, eval_iters=20,
                          metrics_every=100),
    )


def llama_tiny() -> WorkloadConfig:
    """docs/science.md §1.2 Tiny-C: a 2-layer, d=64 Llama-style model on a small token stream."""
    return WorkloadConfig(
        preset="llama-tiny",
        model=GPTConfig(
            arch="llama", n_layer=2, n_head=2, n_embd=64, block_size=64, tie_embeddings=False
        ),
        data=DataConfig(corpus="shakespeare", tokenizer="gpt2"),
        optim=OptimConfig(lr=1e-3, warmup_steps=20),
        train=TrainConfig(steps=200, batch_size=8, eval_every=50, eval_iters=10, metrics_every=50),
    )


def mlp_debug() -> WorkloadConfig:
    """A 4 x 64 residual MLP on real MNIST; seconds on CPU."""
    return WorkloadConfig(
        preset="mlp-debug",
        model=MLPConfig(width=64, depth=4),
        data=DataConfig(corpus="mnist", tokenizer="none"),
        optim=OptimConfig(lr=1e-3, beta2=0.999, weight_decay=0.0, warmup_steps=0,
                          schedule="constant", grad_clip=0.0),
        train=TrainConfig(steps=30, batch_size=64, eval_every=10, eval_iters=2, metrics_every=10),
        metrics=MetricsConfig(grad_probes=2),
    )


def mlp_mnist() -> WorkloadConfig:
    """docs/science.md §4.5: 16 x 256 on MNIST, Adam 1e-3, batch 128, 10 epochs, metrics/50."""
    return WorkloadConfig(
        preset="mlp-mnist",
        model=MLPConfig(width=256, depth=16),
        data=DataConfig(corpus="mnist", tokenizer="none"),
        optim=OptimConfig(lr=1e-3, beta2=0.999, weight_decay=0.0, warmup_steps=0,
                          schedule="constant", grad_clip=0.0),
        train=TrainConfig(steps=4690, epochs=10, batch_size=128, eval_every=500, eval_iters=20,
                          metrics_every=50),
        metrics=MetricsConfig(grad_probes=4),
    )


def gpt2_small() -> WorkloadConfig:
    """GPT-2 small (124M), nanoGPT defaults (docs/science.md §1.1); meant for GPUs."""
    return WorkloadConfig(
        preset="gpt2-small",
        model=GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024),
        data=DataConfig(corpus="shakespeare", tokenizer="gpt2"),
        optim=OptimConfig(lr=6e-4, warmup_steps=1000),
        train=TrainConfig(steps=50_000, batch_size=12, grad_accum=5, eval_every=1000,
                          eval_iters=200, metrics_every=1000, dtype="bf16", compile=True),
    )


PRESETS: dict[str, Callable[[], WorkloadConfig]] = {
    "gpt-debug": gpt_debug,
    "gpt-tiny": gpt_tiny,
    "llama-tiny": llama_tiny,
    "mlp-debug": mlp_debug,
    "mlp-mnist": mlp_mnist,
    "gpt2-small": gpt2_small,
}


def preset(name: str) -> WorkloadConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]()


# --- dict round trip, flattening, overrides ----------------------------------------------


def to_dict(cfg: WorkloadConfig) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(d: dict) -> WorkloadConfig:
    """Inverse of ``to_dict`` (used to ship configs through Ray and checkpoints)."""
    d = copy.deepcopy(d)
    model = d.get("model", {})
    model_cls = MLPConfig if model.get("arch") == "mlp" else GPTConfig
    optim = d.get("optim", {})
    return WorkloadConfig(
        preset=d.get("preset", ""),
        model=model_cls(**model),
        data=DataConfig(**d.get("data", {})),
        optim=OptimConfig(
            **{k: v for k, v in optim.items() if k not in ("muon", "manifold")},
            muon=MuonConfig(**optim.get("muon", {})),
            manifold=ManifoldConfig(**optim.get("manifold", {})),
        ),
        train=TrainConfig(**d.get("train", {})),
        metrics=MetricsConfig(**d.get("metrics", {})),
    )


def flatten(cfg: WorkloadConfig | dict, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to plain values: ``{"model.residual.p": 1.0, "optim.lr": 1e-3, ...}``."""
    d = to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


INF_SPELLINGS = ("inf", "+inf", ".inf", "infinity", "+infinity")


def parse_p(value: Any) -> Any:
    """The one reader of infinity (p = inf): any of ``INF_SPELLINGS`` (any case, spaces around)
    becomes ``math.inf``; every other value is returned unchanged."""
    if isinstance(value, str) and value.strip().lower() in INF_SPELLINGS:
        return math.inf
    return value


def parse_value(text: str) -> Any:
    """Parse a ``--set key=value`` value: a number first (``3e-3``, ``1_000``, ``nan``, and every
    spelling of ``parse_p``'s infinity), else YAML (``true``, ``[1, 2]``, ``{family: spheret}``).

    Numbers go first because YAML 1.1 reads ``3e-3`` (no dot) as the string ``'3e-3'``."""
    import yaml

    value = parse_p(text)
    if value is math.inf:
        return value
    s = text.strip()
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    class NumberLoader(yaml.SafeLoader):  # 1e-3 inside lists/maps is a float too
        pass

    NumberLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"))
    try:
        return yaml.load(text, Loader=NumberLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        why = str(getattr(e, "problem", None) or e).strip().splitlines()[0]  # one line
        raise ConfigError(f"cannot parse value {text!r}: {why}") from None


def _coerce(value: Any, current: Any, key: str) -> Any:
    value = parse_p(value)
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if isinstance(current, str) and not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def apply_overrides(cfg: WorkloadConfig, overrides: dict[str, Any]) -> WorkloadConfig:
    """Return a copy of ``cfg`` with dotted-key overrides applied.

    Keys must name existing fields, except inside ``model.residual`` (a family's own
    parameters, validated by the family registry) and ``optim.manifold.assignment`` (a map).
    """
    cfg = copy.deepcopy(cfg)
    if "model.arch" in overrides:
        arch = overrides["model.arch"]
        if arch == "mlp" and not isinstance(cfg.model, MLPConfig):
            cfg.model = MLPConfig()
        elif arch in ("gpt", "llama") and not isinstance(cfg.model, GPTConfig):
            cfg.model = GPTConfig(arch=arch)
    for key, value in overrides.items():
        parts = key.split(".")
        obj: Any = cfg
        for i, part in enumerate(parts[:-1]):
            if isinstance(obj, dict):
                obj = obj.setdefault(part, {})
            elif dataclasses.is_dataclass(obj) and hasattr(obj, part):
                obj = getattr(obj, part)
            else:
                missing = ".".join(parts[: i + 1])
                raise ConfigError(f"unknown config key {key!r} (no field {missing!r})")
        last = parts[-1]
        if isinstance(obj, dict):
            obj[last] = parse_p(value)
        elif dataclasses.is_dataclass(obj) and last in {f.name for f in dataclasses.fields(obj)}:
            current = getattr(obj, last)
            if dataclasses.is_dataclass(current):
                raise ConfigError(f"{key}: is a section; set one of its fields instead")
            if isinstance(current, dict) and isinstance(value, dict):
                value = {**current, **value} if last != "residual" else dict(value)
            elif (current is not None and not isinstance(current, (dict, list))
                  and key != "optim.manifold.assignment"):
                value = _coerce(value, current, key)
            setattr(obj, last, value)
        else:
            valid = (sorted(f.name for f in dataclasses.fields(obj))
                     if dataclasses.is_dataclass(obj) else [])
            raise ConfigError(f"unknown config key {key!r}; valid under it: {', '.join(valid)}")
    return cfg
