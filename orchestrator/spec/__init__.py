"""The declarative sweep language: what a spec says, validated, with no Ray.

``yaml_reader`` (guarded YAML, shipped names, one-line errors) -> ``sweep_spec.SweepSpec`` and its
sections (``sections``, ``report_seeds``, ``divergence_rules``, ``claims``), ``params`` (one
space parameter, the exact expansion, arm labels) and ``sets`` (``--set`` on a spec).
``orchestrator/sweep`` runs a spec on Ray, ``orchestrator/analysis`` judges its claims,
``orchestrator/cli`` and ``orchestrator/evaluation`` load it: all look down at this room.
"""
