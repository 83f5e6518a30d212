"""``geosweep resume DIR --until-decided`` (and ``seeds: auto``): add seeds, round by round,
to the arms whose comparison with the baseline is still undecided (analysis/decide.py).

Each round is one ``--more-seeds`` extension (orchestrator/sweep/experiments.py) restricted to
the undecided arms and the baseline (``Extension.only_arms``): the new seeds are the same for
all of them, so the comparison stays paired. It stops when every arm is decided or has spent
its seed budget (``seeds: {auto: true, max: ...}``), or after ``max_rounds``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.spec.report_seeds import AutoSeeds
from orchestrator.spec.sweep_spec import SweepSpec

__all__ = ["DEFAULT_BUDGET", "plan_round", "until_decided"]

DEFAULT_BUDGET = AutoSeeds()  # a spec without seeds: auto: min 2, max 8, effect 0.02


def plan_round(root: Path, spec: SweepSpec, baseline: str | None = None,
               metric: str = "final_val_loss") -> tuple[list[Any], dict[str, int]]:
    """(the decisions, arm -> seeds to add) from the sweep's Parquet trials."""
    from orchestrator.analysis.baseline import choose_baseline
    from orchestrator.analysis.decide import decide, seeds_to_add
    from orchestrator.analysis.load import load_sweep, with_metric

    budget = spec.seed_budget or DEFAULT_BUDGET
    data = load_sweep(root)
    t = with_metric(data, metric)
    base = choose_baseline(t, metric, baseline, spec.report.baseline)
    ds = decide(t, base, metric, effect=budget.effect, max_seeds=budget.max,
                alpha=budget.alpha, power=budget.power)
    return ds, seeds_to_add(ds, base, budget.per_round, budget.max)


def until_decided(root: Path, spec: SweepSpec, run: Callable[[Any], int],
                  printer: Callable[[str], None] = print, baseline: str | None = None,
                  max_rounds: int = 100) -> int:
    """Rounds of ``run(Extension)`` until decided; returns the last exit code (0: done)."""
    from orchestrator.sweep.experiments import Extension

    for _ in range(max_rounds):
        ds, add = plan_round(root, spec, baseline)
        for d in ds:
            printer(f"[until-decided] {d.arm}: {d.state} (n={d.n}, diff {d.diff:+.4g} "
                    f"[{d.lo:+.4g}, {d.hi:+.4g}], Holm p {d.p_holm:.3g}, MDE {d.mde:.3g})")
        if not add:
            printer("[until-decided] every arm is decided or has spent its seed budget")
            return 0
        printer(f"[until-decided] adding {max(add.values())} seed(s) to {len(add)} arms")
        rc = run(Extension(more_seeds=max(add.values()), only_arms=frozenset(add)))
        if rc:
            return rc
    return 0
