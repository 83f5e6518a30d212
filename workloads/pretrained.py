"""Geometric continuity of checkpoints geosweep did not train (docs/science.md §4.2-4.3), streamed.

A CHECKPOINT is a local Hugging Face folder (``config.json`` + ``model.safetensors`` or a sharded
``model.safetensors.index.json``), a hub id (downloaded when online), or a geosweep checkpoint
folder (``state.pt`` from ``workloads/checkpoint.py``). Each architecture's weights map onto the
roles q k v o gate up down (``ARCHITECTURES``); every matrix is brought to the ``nn.Linear``
layout (out x in) and fp32.

Memory: roles are analysed one after another and, within a role, layers in order, so at most two
matrices (layer l and l+1 of one role) are alive; each is read from a freshly opened, memory-mapped
``safe_open`` handle that is closed right after, so the mapped pages leave the process too. The
shuffled-layer-order control is a second pass in a fixed-seed permuted order; it reuses the top-k
singular vectors of the first pass from a temporary folder on disk.

Rows (a pandas DataFrame): ``checkpoint, role, layer, next_layer, metric, side, value`` with
``side`` ``residual`` (the residual-stream side: v for q k v gate up, u for o down) or ``control``
(the hidden side). Metrics: ``top1`` (M1), ``sub{k}`` (M2, k in 1 4 16 below min(m, n)), ``gram``
and ``gram_c`` (M3 and its isotropy-centred form); ``shuffled.<metric>`` on the permuted order's
pairs; ``base.<metric>`` random baselines (layer = next_layer = -1); ``gap`` = s1/s2 per layer
(side ``""``, next_layer = -1).
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pandas as pd
import torch

from workloads.metrics import continuity as C
from workloads.pretrained_metrics import _gram_baseline, _pair_metrics, _top, shuffled_order

__all__ = [
    "CheckpointError",
    "Fetch",
    "Architecture",
    "ARCHITECTURES",
    "ROLES",
    "RESIDUAL_SIDE",
    "COLUMNS",
    "resolve_checkpoint",
    "open_source",
    "detect_architecture",
    "LayerReader",
    "shuffled_order",
    "Analysis",
    "analyse",
]

ROLES = ("q", "k", "v", "o", "gate", "up", "down")
# Which singular side lives in the residual stream (SCIENCE 4.2): "in" = v, "out" = u.
RESIDUAL_SIDE = {"q": "in", "k": "in", "v": "in", "gate": "in", "up": "in", "o": "out",
                 "down": "out"}
COLUMNS = ["checkpoint", "role", "layer", "next_layer", "metric", "side", "value"]
KS = (1, 4, 16)


class CheckpointError(ValueError):
    """A user-facing checkpoint problem; its message is one line."""


# --- architectures -----------------------------------------------------------------------


@dataclass(frozen=True)
class Fetch:
    """How to read one role's matrix: a name template ({p} prefix, {i} layer) and a transform.

    ``transpose``: HF GPT-2 Conv1D stores (in, out). ``chunk``: row block of a fused [Q; K; V].
    """

    template: str
    transpose: bool = False
    chunk: int | None = None
    n_chunks: int = 1


@dataclass(frozen=True)
class Architecture:
    name: str
    detect: str  # regex on tensor names with groups p (prefix) and i (layer)
    roles: dict[str, Fetch]


def _qkv(template: str, transpose: bool) -> dict[str, Fetch]:
    return {r: Fetch(template, transpose, c, 3) for c, r in enumerate(("q", "k", "v"))}


_P = r"^(?P<p>(?:.*\.)?)"
ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in [
        Architecture("llama", _P + r"layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$", {
            **{r: Fetch(f"{{p}}layers.{{i}}.self_attn.{r}_proj.weight") for r in "qkvo"},
            **{r: Fetch(f"{{p}}layers.{{i}}.mlp.{r}_proj.weight") for r in ("gate", "up", "down")},
        }),
        Architecture("gpt2", _P + r"h\.(?P<i>\d+)\.attn\.c_attn\.weight$", {
            **_qkv("{p}h.{i}.attn.c_attn.weight", transpose=True),
            "o": Fetch("{p}h.{i}.attn.c_proj.weight", transpose=True),
            "up": Fetch("{p}h.{i}.mlp.c_fc.weight", transpose=True),
            "down": Fetch("{p}h.{i}.mlp.c_proj.weight", transpose=True),
        }),
        Architecture("bert", _P + r"encoder\.layer\.(?P<i>\d+)\.attention\.self\.query\.weight$", {
            "q": Fetch("{p}encoder.layer.{i}.attention.self.query.weight"),
            "k": Fetch("{p}encoder.layer.{i}.attention.self.key.weight"),
            "v": Fetch("{p}encoder.layer.{i}.attention.self.value.weight"),
            "o": Fetch("{p}encoder.layer.{i}.attention.output.dense.weight"),
            "up": Fetch("{p}encoder.layer.{i}.intermediate.dense.weight"),
            "down": Fetch("{p}encoder.layer.{i}.output.dense.weight"),
        }),
        # geosweep's own names (docs/contracts.md): nn.Linear layout, fused c_attn rows [Q; K; V].
        Architecture("geosweep-llama", r"^(?P<p>)blocks\.(?P<i>\d+)\.attn\.q\.weight$", {
            **{r: Fetch(f"blocks.{{i}}.attn.{r}.weight") for r in "qkvo"},
            **{r: Fetch(f"blocks.{{i}}.mlp.{r}.weight") for r in ("gate", "up", "down")},
        }),
        Architecture("geosweep-gpt", r"^(?P<p>)blocks\.(?P<i>\d+)\.attn\.c_attn\.weight$", {
            **_qkv("blocks.{i}.attn.c_attn.weight", transpose=False),
            "o": Fetch("blocks.{i}.attn.c_proj.weight"),
            "up": Fetch("blocks.{i}.mlp.c_fc.weight"),
            "down": Fetch("blocks.{i}.mlp.c_proj.weight"),
        }),
    ]
}


# --- resolving and opening a checkpoint --------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_reachable(timeout: float = 2.0) -> bool:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve_checkpoint(ref: str | os.PathLike) -> Path:
    """A local folder (a file inside it is taken as its folder) or a hub id, downloaded."""
    p = Path(ref).expanduser()
    if p.exists():
        return (p.parent if p.is_file() else p).resolve()
    ref = str(ref)
    if not _HUB_ID.match(ref):
        raise CheckpointError(f"CHECKPOINT: {ref!r} is neither a local folder nor a hub id "
                              "(owner/name)")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise CheckpointError(f"CHECKPOINT: {ref!r} is not a local folder and the Hugging Face "
                              "hub is offline (HF_HUB_OFFLINE is set)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"CHECKPOINT: {ref!r} is not a local folder and huggingface_hub "
                              "is not installed to download it") from None
    if not _hub_reachable():
        raise CheckpointError(f"CHECKPOINT: {ref!r} is not a local folder and the Hugging Face "
                              "hub is unreachable (offline?)")
    try:
        return Path(snapshot_download(ref, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as e:  # noqa: BLE001 - hub errors are many; the user needs one line
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"CHECKPOINT: cannot download {ref!r} ({msg})") from None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"CHECKPOINT: {path} is not valid JSON ({e})") from None


def _finite_tensor(t: torch.Tensor, name: str, where: Path) -> torch.Tensor:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"CHECKPOINT: {where}: tensor {name} holds NaN or inf; "
                              "the weights are broken")
    return t


class SafetensorsSource:
    """Tensor names -> shard file; every read opens a fresh memory-mapped handle and closes it."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        if index.exists():
            doc = _json(index)
            wmap = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(wmap, dict) or not all(
                    isinstance(v, str) and "/" not in v and ".." not in v for v in wmap.values()):
                raise CheckpointError(f"CHECKPOINT: {index} has no valid weight_map (a dict of "
                                      "tensor name -> shard file in the folder)")
            self.files = {k: folder / v for k, v in wmap.items()}
            missing = sorted({str(f.name) for f in self.files.values() if not f.exists()})
            if missing:
                raise CheckpointError(f"CHECKPOINT: {index} names missing shards: "
                                      f"{', '.join(missing[:3])}")
        else:
            from safetensors import safe_open

            self.files = {}
            for f in sorted(folder.glob("*.safetensors")):
                try:
                    with safe_open(f, framework="pt") as h:
                        self.files.update({k: f for k in h.keys()})
                except Exception as e:  # noqa: BLE001 - safetensors raises its own kinds
                    raise CheckpointError(f"CHECKPOINT: {f} is not a readable safetensors file "
                                          f"({str(e)[:80]}); download it again") from None
        self.meta: dict[str, Any] = {}
        if (folder / "config.json").exists():
            meta = _json(folder / "config.json")
            if not isinstance(meta, dict):
                raise CheckpointError(f"CHECKPOINT: {folder / 'config.json'} is not a JSON "
                                      "object")
            self.meta = meta

    def keys(self) -> list[str]:
        return list(self.files)

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        try:
            with safe_open(self.files[name], framework="pt") as h:
                t = h.get_tensor(name)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own kinds
            raise CheckpointError(f"CHECKPOINT: {self.files[name]}: cannot read {name} "
                                  f"({str(e)[:80]}); download it again") from None
        return _finite_tensor(t, name, self.files[name])


class StateSource:
    """A geosweep ``state.pt``: the state_dict under ``model``, loaded memory-mapped."""

    def __init__(self, path: Path):
        from workloads.checkpoint import CheckpointLoadError, safe_load

        try:  # weights_only with our allow-list: a state.pt from elsewhere runs no code
            state = safe_load(path, mmap=True)
        except CheckpointLoadError as e:
            raise CheckpointError(f"CHECKPOINT: {e}") from None
        if not isinstance(state, dict) or "model" not in state:
            raise CheckpointError(f"CHECKPOINT: {path} is not a geosweep checkpoint (no 'model')")
        self.path = path
        self.state_dict: dict[str, torch.Tensor] = state["model"]
        self.meta = state.get("config") or {}

    def keys(self) -> list[str]:
        return list(self.state_dict)

    def get(self, name: str) -> torch.Tensor:
        return _finite_tensor(self.state_dict[name], name, self.path)


def open_source(folder: Path) -> SafetensorsSource | StateSource:
    """The tensor source of a resolved folder: safetensors first (a format that holds no code),
    then a geosweep ``state.pt`` (loaded with weights_only and an allow-list)."""
    from workloads.checkpoint import latest_checkpoint

    for f in [*folder.glob("*.safetensors"), *folder.glob("*.json"), folder / "state.pt"]:
        # a FIFO blocks the first read forever; a device (/dev/zero) never ends
        if f.exists() and not f.is_file():
            raise CheckpointError(f"CHECKPOINT: {f} is not a regular file (a pipe, device or "
                                  "folder); a model folder holds files only")
    if (folder / "model.safetensors.index.json").exists() or any(folder.glob("*.safetensors")):
        return SafetensorsSource(folder)
    if (folder / "state.pt").exists():
        return StateSource(folder / "state.pt")
    latest = latest_checkpoint(folder)
    if latest is not None:
        return StateSource(latest / "state.pt")
    raise CheckpointError(f"CHECKPOINT: {folder} holds no model.safetensors, "
                          "model.safetensors.index.json or geosweep state.pt")


def detect_architecture(names: list[str]) -> tuple[Architecture, str, int, list[str]]:
    """(architecture, name prefix, number of layers, roles present) from the tensor names."""
    present = set(names)
    for arch in ARCHITECTURES.values():
        rx = re.compile(arch.detect)
        hits = [m for m in map(rx.match, names) if m]
        if not hits:
            continue
        prefix = hits[0]["p"]
        layers = sorted({int(m["i"]) for m in hits if m["p"] == prefix})
        if layers != list(range(len(layers))):
            raise CheckpointError(f"CHECKPOINT: {arch.name} layers are not 0..L-1: {layers}")
        if len(layers) < 2:
            raise CheckpointError(f"CHECKPOINT: {arch.name} with {len(layers)} layer has no "
                                  "adjacent layer pair")
        roles = [r for r in ROLES if r in arch.roles and all(
            arch.roles[r].template.format(p=prefix, i=i) in present for i in layers)]
        if not roles:
            want = [f.template.format(p=prefix, i=0) for f in arch.roles.values()]
            raise CheckpointError(f"CHECKPOINT: {arch.name} layout but no role is complete over "
                                  f"its {len(layers)} layers (expected e.g. {', '.join(want[:3])})")
        return arch, prefix, len(layers), roles
    weights = [n for n in names if n.endswith("weight")] or names
    raise CheckpointError(
        f"CHECKPOINT: unknown architecture (known: {', '.join(ARCHITECTURES)}); saw "
        f"{len(names)} tensors, e.g. {', '.join(weights[:6])}")


class LayerReader:
    """Reads one role's matrix of one layer as fp32 (out x in); keeps nothing."""

    def __init__(self, source: SafetensorsSource | StateSource, arch: Architecture, prefix: str):
        self.source, self.arch, self.prefix = source, arch, prefix
        self.shapes: dict[str, tuple[int, tuple[int, ...]]] = {}  # role -> (layer, its shape)

    def load(self, role: str, layer: int) -> torch.Tensor:
        f = self.arch.roles[role]
        name = f.template.format(p=self.prefix, i=layer)
        W = self.source.get(name)
        # continuity compares one role's matrices layer to layer: each is 2-D, all of one
        # shape (a 1-D or odd-shaped tensor failed deep in the metrics with a traceback)
        if W.dim() != 2:
            raise CheckpointError(f"CHECKPOINT: {name} has shape {tuple(W.shape)}; role {role} "
                                  "needs a matrix (2-D weight) in every layer")
        first = self.shapes.setdefault(role, (layer, tuple(W.shape)))
        if tuple(W.shape) != first[1]:
            raise CheckpointError(f"CHECKPOINT: {name} has shape {tuple(W.shape)} but layer "
                                  f"{first[0]}'s {role} has {first[1]}; continuity compares "
                                  "same-shaped matrices of adjacent layers")
        if f.transpose:
            W = W.T
        if f.chunk is not None:
            W = W.chunk(f.n_chunks, dim=0)[f.chunk]
        # A fresh fp32 copy: no view keeps the fused tensor or a memory map alive.
        return W.to(torch.float32, copy=True).contiguous()


# --- the analysis (metrics: workloads/pretrained_metrics.py) ----------------------------


@dataclass
class Analysis:
    checkpoint: str
    path: Path
    architecture: str
    n_layers: int
    roles: list[str]
    shuffled: list[int]
    rows: pd.DataFrame = field(repr=False)


@torch.no_grad()
def analyse(checkpoint: str | os.PathLike, ks: tuple[int, ...] = KS, seed: int = 0,
            exact_max: int = 2048) -> Analysis:
    """Continuity of every role over all adjacent layer pairs, plus shuffled and baselines."""
    path = resolve_checkpoint(checkpoint)
    source = open_source(path)
    arch, prefix, L, roles = detect_architecture(source.keys())
    reader = LayerReader(source, arch, prefix)
    perm = shuffled_order(L, seed)
    label = str(checkpoint)
    rows: list[tuple] = []

    def emit(role, a, b, metric, vec, value):
        side = "" if vec == "" else ("residual" if vec == RESIDUAL_SIDE[role] else "control")
        rows.append((label, role, a, b, metric, side, float(value)))

    with tempfile.TemporaryDirectory(prefix="geosweep-continuity-") as cache:
        for role in roles:
            kk: list[int] = []
            for order, tag in ((list(range(L)), ""), (perm, "shuffled.")):
                prev = None  # (layer, W, top-k)
                for layer in order:
                    W = reader.load(role, layer)
                    m, n = W.shape
                    f = Path(cache) / f"{role}-{layer}.pt"
                    if not tag:
                        kk = [k for k in ks if k < min(m, n)]
                        kmax = max(kk + [2])
                        top = _top(W, kmax, exact_max)
                        torch.save(top, f)
                        S = top["S"]
                        emit(role, layer, -1, "gap", "", S[0] / S[1].clamp_min(1e-30))
                    else:  # each layer comes exactly once in the permuted pass
                        top = torch.load(f)
                        f.unlink()
                    if prev is not None:
                        for metric, vec, v in _pair_metrics(prev[1], prev[2], W, top, kk):
                            emit(role, prev[0], layer, tag + metric, vec, v)
                    prev = (layer, W, top)
                    del W, top
            for vec, dim in (("in", n), ("out", m)):
                emit(role, -1, -1, "base.top1", vec, C.random_baseline_top1(dim))
                for k in kk:
                    emit(role, -1, -1, f"base.sub{k}", vec, C.random_baseline_subspace(k, dim))
                emit(role, -1, -1, "base.gram", vec, _gram_baseline(m, n, vec))
                emit(role, -1, -1, "base.gram_c", vec, 0.0)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return Analysis(label, path, arch.name, L, roles, perm, frame)
