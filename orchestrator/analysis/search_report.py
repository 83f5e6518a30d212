"""The report's section for searches (and grids): leaderboard, objective vs each searched
parameter, parallel coordinates, parameter importance. ``write_report`` calls
``search_section`` once; it writes ``leaderboard.csv``, ``importance.csv`` and two figures
into the report folder (logged to MLflow with the rest of it) and returns markdown lines.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from orchestrator.analysis.importance import param_importance
from orchestrator.analysis.leaderboard import leaderboard, searched_params
from orchestrator.analysis.search_figures import fig_objective_vs_params, fig_parallel
from orchestrator.analysis.timing import stage

__all__ = ["search_section", "sweep_mode"]


def sweep_mode(root: Path) -> str:
    """``search.mode`` of the sweep's spec.yaml (min when absent or unreadable)."""
    import yaml

    try:
        spec = yaml.safe_load((root / "spec.yaml").read_text()) or {}
        mode = (spec.get("search") or {}).get("mode", "min")
    except (OSError, yaml.YAMLError, AttributeError):
        return "min"
    return mode if mode in ("min", "max") else "min"


def search_section(trials: pd.DataFrame, root: Path, name: str, out: Path,
                   md_table, top: int = 20) -> tuple[list[str], list[str]]:
    """(markdown lines, one line per skipped figure). ``md_table``: the report's renderer."""
    mode = sweep_mode(root)
    lines = ["## Search", ""]
    skipped: list[str] = []
    params = searched_params(trials)
    with stage("leaderboard"):
        board = leaderboard(trials, top=top, mode=mode)
    board.to_csv(out / "leaderboard.csv", index=False)
    lines += [f"### Leaderboard (top {len(board)} of {len(trials)} by the objective, "
              f"{'lowest' if mode == 'min' else 'highest'} first; diverged and failed last)",
              "", md_table(board), "Step: the last step the trial reached. All trials: "
              "[trials.csv](trials.csv).", ""]
    for fig, fname, title in ((fig_objective_vs_params, "objective_vs_params.png",
                               "Objective vs each searched parameter"),
                              (fig_parallel, "parallel_coordinates.png",
                               "Parallel coordinates")):
        with stage(f"figure {fname.removesuffix('.png')}"):
            why = fig(trials, out / fname)
        if why:
            skipped.append(why)
        else:
            lines += [f"### {title}", "", f"![{title}]({fname})", ""]
    with stage("importance"):
        imps, note = param_importance(trials, root, name, mode) if params else (
            None, "parameter importance: no searched parameter varies")
    lines += ["### Parameter importance", "", note, ""]
    if imps:
        tab = pd.DataFrame({"parameter": list(imps), "importance": list(imps.values())})
        tab.to_csv(out / "importance.csv", index=False)
        lines += [md_table(tab), ""]
    return lines, skipped
