"""A trial's final model weights as MLflow artifacts, and ``load_model`` to get them back.

Artifact layout on the trial's child run (``artifact_path="model"``)::

    model/model.safetensors   the model's state_dict (tied weights stored once: safetensors'
                              save_model keeps one name of ``wte.weight`` = ``lm_head.weight``)
    model/config.json         the full workload config (workloads.config.to_dict), with
                              ``model.vocab_size`` filled in, so it rebuilds the model alone
    model/tokenizer.json      language models: {"tokenizer": gpt2 | char, "char_vocab": ...}
    model/README.txt          how to load it

``load_model("runs:/<run id>/model", tracking_uri=...)`` (or an ``mlflow-artifacts:`` URI, a
local ``model`` folder, or a geosweep ``step-<08d>`` checkpoint folder) returns
``(model, cfg)``: the model rebuilt with ``build_model``, weights loaded strictly, eval mode.

``keep_weights`` runs at the end of a sweep: the best trial's weights always, every completed
trial's when the spec says ``tracking.keep_weights: all`` (``none``: nothing).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

# torch is imported where a model is built: a sweep's driver logs the weights its trials
# prepared (prepare_weights) without importing it
if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["ARTIFACT_PATH", "model_from_checkpoint", "save_weights", "prepare_weights",
           "log_weights", "load_model", "best_record", "keep_weights"]

ARTIFACT_PATH = "model"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
_PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"

_README = """\
Final weights of geosweep trial {trial} (sweep {sweep}), training step {step}.

  model.safetensors  the model's state_dict (tied weights stored once)
  config.json        the full workload config (workloads.config.to_dict)
  tokenizer.json     the tokenizer the model was trained with (language models)

Load it with one call (from a geosweep checkout, PYTHONPATH at its root):

    from orchestrator.store.weights import load_model
    model, cfg = load_model("runs:/{run_id}/model", tracking_uri="{tracking_uri}")
    logits, _ = model(x)        # x: (B, T) token ids, T <= cfg.model.block_size

or, from a downloaded copy of this folder: load_model("path/to/model").
"""


# --- building a model from what training saved ----------------------------------------------


def _with_vocab(cfg: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """``cfg`` with ``model.vocab_size`` set to the trained embedding's rows (already padded),
    so the model is rebuilt without the tokenizer or the corpus."""
    m = cfg.model
    if getattr(m, "arch", None) in ("gpt", "llama") and not m.vocab_size \
            and "wte.weight" in state_dict:
        m = dataclasses.replace(m, vocab_size=int(state_dict["wte.weight"].shape[0]))
        cfg = dataclasses.replace(cfg, model=m)
    return cfg


def model_from_checkpoint(path: str | os.PathLike) -> tuple[nn.Module, Any, int]:
    """A ``step-<08d>`` checkpoint folder -> (model in eval mode, WorkloadConfig, step)."""
    from workloads.checkpoint import load_checkpoint
    from workloads.config import from_dict
    from workloads.models import build_model

    state = load_checkpoint(path)
    sd = state["model"]
    cfg = _with_vocab(from_dict(state["config"]), sd)
    model = build_model(cfg.model)
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model, cfg, int(state["step"])


def _tokenizer_info(cfg: Any) -> dict[str, Any] | None:
    """The tokenizer of a language model (char vocabularies come from the token cache)."""
    if getattr(cfg.model, "arch", None) == "mlp":
        return None
    info: dict[str, Any] = {"tokenizer": cfg.data.tokenizer, "corpus": cfg.data.corpus}
    if cfg.data.tokenizer == "char":
        from workloads.data import token_cache_paths

        try:
            meta = json.loads(token_cache_paths(cfg.data)[1].read_text())
            info["char_vocab"] = meta["char_vocab"]
        except (OSError, ValueError, KeyError):
            info["char_vocab"] = None  # corpus or cache gone: the config still names it
    return info


def save_weights(model: nn.Module, cfg: Any, folder: str | os.PathLike,
                 readme: str | None = None) -> Path:
    """Write ``model.safetensors``, ``config.json`` (+ ``tokenizer.json``, ``README.txt``)."""
    from safetensors.torch import save_model

    from workloads.config import to_dict

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    # save_model (not save_file): it de-duplicates tied tensors instead of refusing them
    save_model(model, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps(to_dict(cfg), indent=2, default=str))
    tok = _tokenizer_info(cfg)
    if tok is not None:
        (out / TOKENIZER_FILE).write_text(json.dumps(tok))
    if readme:
        (out / "README.txt").write_text(readme)
    return out


def prepare_weights(checkpoint: str | os.PathLike, into: str | os.PathLike) -> Path:
    """What ``log_weights`` logs of a ``step-<08d>`` checkpoint, written into ``into/model/``
    (no README: it names the MLflow run). A trial calls it for its final checkpoint, beside
    ``step-<08d>/`` in the folder it reports, so that the sweep's driver logs the files as
    they are at the sweep's end: torch and a model build are already paid in the trial, and
    the driver's teardown would otherwise import torch (seconds) only for this."""
    model, cfg, _ = model_from_checkpoint(checkpoint)
    return save_weights(model, cfg, Path(into) / ARTIFACT_PATH)


def _prepared(checkpoint: str | os.PathLike) -> Path | None:
    """The weights the trial prepared beside its checkpoint (``prepare_weights``), if any."""
    folder = Path(checkpoint).parent / ARTIFACT_PATH
    if (folder / WEIGHTS_FILE).is_file() and (folder / CONFIG_FILE).is_file():
        return folder
    return None


def log_weights(client: Any, run_id: str, checkpoint: str | os.PathLike, *, trial: str = "",
                sweep: str = "", tracking_uri: str = "") -> str:
    """Log the checkpoint's model as artifacts ``model/`` of ``run_id``; returns its URI.
    The files the trial prepared beside it (``prepare_weights``) are logged as they are;
    without them the model is rebuilt from the checkpoint here.

    Logging again overwrites the same files (one copy per run)."""
    from orchestrator.store.checkpoints import checkpoint_step

    ready = _prepared(checkpoint)
    step = checkpoint_step(checkpoint)
    readme = _README.format(trial=trial or "?", sweep=sweep or "?", step=step, run_id=run_id,
                            tracking_uri=tracking_uri or "<the sweep's mlflow_uri>")
    if ready is not None:
        client.log_artifacts(run_id, str(ready), artifact_path=ARTIFACT_PATH)
        client.log_text(run_id, readme, f"{ARTIFACT_PATH}/README.txt")
    else:
        model, cfg, step = model_from_checkpoint(checkpoint)
        with tempfile.TemporaryDirectory(prefix="geosweep-weights-") as tmp:
            folder = save_weights(model, cfg, Path(tmp) / ARTIFACT_PATH, readme)
            client.log_artifacts(run_id, str(folder), artifact_path=ARTIFACT_PATH)
    client.set_tag(run_id, "geosweep.weights", f"{ARTIFACT_PATH}/ (step {step})")
    return f"runs:/{run_id}/{ARTIFACT_PATH}"


# --- loading -------------------------------------------------------------------------------


def _resolve_tracking_uri(tracking_uri: str | None) -> str | None:
    """A sweep folder is accepted as the tracking URI: its ``sweep.json`` names the store."""
    if tracking_uri and "://" not in tracking_uri and (Path(tracking_uri) / "sweep.json").exists():
        from orchestrator.store.runs import sweep_tracking_uri

        return sweep_tracking_uri(tracking_uri)
    return tracking_uri


def _load_folder(folder: Path) -> tuple[nn.Module, Any]:
    from safetensors.torch import load_model as st_load

    from workloads.config import from_dict
    from workloads.models import build_model

    if (folder / ARTIFACT_PATH / WEIGHTS_FILE).exists():
        folder = folder / ARTIFACT_PATH
    if not (folder / WEIGHTS_FILE).exists() or not (folder / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{folder}: no {WEIGHTS_FILE} + {CONFIG_FILE} (a geosweep "
                                "model folder) and no state.pt (a geosweep checkpoint)")
    cfg = from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    model = build_model(cfg.model)
    st_load(model, str(folder / WEIGHTS_FILE), strict=True)
    model.eval()
    return model, cfg


def load_model(uri_or_path: str | os.PathLike,
               tracking_uri: str | None = None) -> tuple[nn.Module, Any]:
    """(model in eval mode, WorkloadConfig) from saved weights, in one call.

    ``uri_or_path``: ``runs:/<run id>/model``, any MLflow artifact URI (``mlflow-artifacts:/``,
    ``file://``), a local folder holding ``model.safetensors`` + ``config.json`` (or its parent),
    or a geosweep checkpoint folder ``step-<08d>``. ``tracking_uri``: the MLflow store for
    ``runs:/`` URIs; a sweep folder works too (default: MLflow's own default).
    """
    ref = str(uri_or_path)
    local = Path(ref).expanduser()
    if "://" not in ref and not ref.startswith(("runs:", "models:", "mlflow-artifacts:")):
        # safetensors first (a format that holds no code); a state.pt loads with
        # weights_only and geosweep's allow-list (workloads/checkpoint.py safe_load)
        if (local / WEIGHTS_FILE).exists() or (local / ARTIFACT_PATH / WEIGHTS_FILE).exists():
            return _load_folder(local)
        if (local / "state.pt").exists():
            model, cfg, _ = model_from_checkpoint(local)
            return model, cfg
        if not local.is_dir():
            raise FileNotFoundError(f"{ref}: no such model folder")
        return _load_folder(local)
    import mlflow.artifacts

    tmp = tempfile.mkdtemp(prefix="geosweep-load-")
    bar = os.environ.get(_PROGRESS_BAR)
    os.environ[_PROGRESS_BAR] = "false"  # a tqdm bar per small download is noise
    try:
        got = mlflow.artifacts.download_artifacts(
            artifact_uri=ref, dst_path=tmp, tracking_uri=_resolve_tracking_uri(tracking_uri))
        return _load_folder(Path(got))
    finally:
        if bar is None:
            os.environ.pop(_PROGRESS_BAR, None)
        else:
            os.environ[_PROGRESS_BAR] = bar
        shutil.rmtree(tmp, ignore_errors=True)


# --- at the end of a sweep -----------------------------------------------------------------


def best_record(records: list[dict[str, Any]], mode: str = "min") -> dict[str, Any] | None:
    """The completed trial with the best finite ``final_val_loss`` (the sweep's best)."""
    ok = [r for r in records if r.get("status") == "completed"
          and isinstance(r.get("final_val_loss"), (int, float))
          and math.isfinite(r["final_val_loss"])]
    if not ok:
        return None
    return (min if mode == "min" else max)(ok, key=lambda r: r["final_val_loss"])


def keep_weights(spec: Any, sweep_dir: str | os.PathLike, records: list[dict[str, Any]],
                 client: Any, printer=print) -> dict[str, str]:
    """Log final weights per ``spec.tracking.keep_weights``; ``{trial id: runs:/ URI}``.

    Never fails the sweep: a trial whose weights cannot be logged gets one warning line."""
    from orchestrator.store.checkpoints import final_checkpoint
    from orchestrator.store.runs import trial_runs

    policy = spec.tracking.keep_weights
    if policy == "none" or not records:
        return {}
    best = best_record(records, spec.search.mode)
    if policy == "all":
        chosen = [r for r in records if r.get("status") == "completed"]
    else:
        chosen = [best] if best is not None else []
    if not chosen:
        return {}
    try:
        runs = trial_runs(client, spec.name, spec.tracking.experiment,
                          trials=[str(r["trial"]) for r in chosen])
    except Exception as e:  # noqa: BLE001 - a finished sweep must not fail here
        printer(f"[geosweep] warning: final weights not kept (MLflow: {type(e).__name__}: {e})")
        return {}
    uri = str(client.tracking_uri) if hasattr(client, "tracking_uri") else ""
    kept: dict[str, str] = {}
    for rec in chosen:
        tid = str(rec["trial"])
        ckpt = final_checkpoint(sweep_dir, tid)
        why = ("no MLflow run" if tid not in runs else "no final checkpoint" if ckpt is None
               else "")
        if not why:
            try:
                kept[tid] = log_weights(client, runs[tid], ckpt, trial=tid, sweep=spec.name,
                                        tracking_uri=uri)
            except Exception as e:  # noqa: BLE001 - a finished sweep must not fail here
                why = f"{type(e).__name__}: {e}"
        if why:
            printer(f"[geosweep] warning: weights of trial {tid} not kept ({why})")
    if best is not None and str(best["trial"]) in kept:
        printer(f"[geosweep] best trial's weights: {kept[str(best['trial'])]} "
                "(orchestrator.store.weights.load_model)")
    return kept
