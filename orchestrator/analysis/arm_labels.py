"""How arms read in the report's tables and legends.

An arm label is ``key=value`` pairs joined by commas (``model.residual.p=2,optim.lr=0.003``:
orchestrator/spec/params.py). ``arm_names`` gives each arm the name its trials have in MLflow,
Parquet and ``geosweep status`` without the seed (``p=2 lr=3e-3``); ``short_labels`` keeps only
the pairs that differ between arms.
"""

from __future__ import annotations

__all__ = ["arm_names", "short_labels"]


def _parse_arm(arm: str) -> dict[str, str] | None:
    pairs = arm.split(",")
    if not all("=" in p for p in pairs):
        return None
    return dict(p.split("=", 1) for p in pairs)


def short_labels(arms: list[str], drop: str | None = None) -> dict[str, str]:
    """Legend labels: the ``key=value`` pairs that differ between arms, keys shortened to their
    last dotted part; ``drop`` removes one key (the x axis). Full labels when ambiguous."""
    parsed = [_parse_arm(a) for a in arms]
    if any(kv is None for kv in parsed):
        return {a: a for a in arms}
    keys = list(dict.fromkeys(k for kv in parsed for k in kv))
    vary = [k for k in keys if k != drop and len({kv.get(k) for kv in parsed}) > 1]
    out = {a: " ".join(f"{k.split('.')[-1]}={kv[k]}" for k in vary if k in kv)
           for a, kv in zip(arms, parsed)}
    if drop is None and (len(set(out.values())) < len(arms) or not all(out.values())):
        return {a: a for a in arms}
    return out


def arm_names(arms: list[str]) -> dict[str, str]:
    """Legend labels: each arm's name as its trials are named in MLflow, Parquet and status
    without the seed (store/run_names.py: ``p=0.374 lr=1.42e-3``); ``short_labels`` where two
    arms would read the same or a label is not ``key=value`` pairs."""
    from orchestrator.store.run_names import run_name

    out = {}
    for a in arms:
        kv = _parse_arm(a)
        if kv is None:
            return short_labels(arms)
        out[a] = run_name({k: _number(v) for k, v in kv.items()})
    return out if len(set(out.values())) == len(arms) else short_labels(arms)


def _number(v: str):
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f
