"""benchmarks/sweep_vs_peers.py without running its arms: the figures from made-up runs (the
per-round ratios, the per-trial figures of one definition for both Tune arms, the JSON keys
issue 32 asks for), and the CPU trace of a real process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("sweep_vs_peers",
                                                  ROOT / "benchmarks" / "sweep_vs_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


KEYS = {"geosweep_vs_raytune_5s", "geosweep_vs_raytune_1s", "report_block_ms_median",
        "driver_cpu_s_per_trial", "time_to_first_trial_s", "time_to_first_trial_warm_s",
        "teardown_s", "load_avg", "geosweep_vs_ideal_5s", "raytune_vs_ideal_5s",
        "optuna_vs_ideal_5s", "geosweep_vs_ideal_1s", "raytune_vs_ideal_1s",
        "optuna_vs_ideal_1s", "raytune_report_block_ms_median", "raytune_driver_cpu_s_per_trial",
        "raytune_time_to_first_trial_s", "raytune_time_to_first_trial_warm_s",
        "raytune_teardown_s", "teardown_cold_s", "driver_loop_cpu_s_per_trial"}


def _row(arm, size, wall, warm=False, **kw):
    return {"arm": arm, "size": size, "wall_s": wall, "round": 0, "warm": warm, **kw}


def test_summary_prints_the_table_and_every_key(capsys):
    b = _bench()
    rows = [_row("ideal", "5s", 20.0), _row("optuna", "5s", 22.0),
            _row("raytune", "5s", 25.0, time_to_first_trial_s=6.0, teardown_s=2.0,
                 driver_cpu_s_per_trial=0.05, driver_loop_cpu_s_per_trial=0.04),
            _row("geosweep", "5s", 24.0, time_to_first_trial_s=5.0, teardown_s=1.5,
                 driver_cpu_s_per_trial=0.09, driver_loop_cpu_s_per_trial=0.03,
                 checkpoint_report_ms=[30.0, 40.0]),
            _row("ideal", "1s", 16.0), _row("optuna", "1s", 20.0),
            _row("raytune", "1s", 40.0, time_to_first_trial_s=8.0, teardown_s=3.0,
                 driver_cpu_s_per_trial=0.06),
            _row("geosweep", "1s", 42.0, time_to_first_trial_s=7.0, teardown_s=2.5,
                 driver_cpu_s_per_trial=0.11),
            _row("geosweep_lean", "5s", 23.0, driver_cpu_s_per_trial=0.055),
            _row("geosweep_lean", "1s", 41.0, driver_cpu_s_per_trial=0.05),
            _row("raytune", "reports", 30.0, report_block_ms=[10.0, 12.0, 14.0]),
            _row("geosweep", "reports", 31.0, report_block_ms=[9.0, 11.0]),
            _row("raytune", "warm", 10.0, True, time_to_first_trial_s=3.0, teardown_s=2.0),
            _row("geosweep", "warm", 9.0, True, time_to_first_trial_s=2.5, teardown_s=0.5)]
    b._summary(rows, ["ideal", "optuna", "raytune", "geosweep", "geosweep_lean"],
               ["5s", "1s", "reports"], 1,
               90.0, (1.0, 1.1, 1.2), (2.0, 2.1, 2.2), False)
    out = capsys.readouterr().out.strip().splitlines()
    got = json.loads(out[-1])
    assert KEYS <= set(got)
    assert got["geosweep_vs_raytune_5s"] == round(24 / 25, 3)
    assert got["geosweep_vs_raytune_1s"] == round(42 / 40, 3)
    assert got["optuna_vs_ideal_1s"] == 1.25 and got["raytune_vs_ideal_5s"] == 1.25
    assert got["report_block_ms_median"] == 10.0 and got["raytune_report_block_ms_median"] == 12.0
    assert got["checkpoint_report_ms_median"] == 35.0
    assert got["driver_cpu_s_per_trial"] == 0.11  # the dearer size
    assert got["time_to_first_trial_s"] == 6.0 and got["time_to_first_trial_warm_s"] == 2.5
    assert got["teardown_s"] == 0.5 and got["raytune_teardown_s"] == 2.0
    assert got["teardown_cold_s"] == 2.0 and got["load_avg"] == [1.0, 2.0]
    assert got["geosweep_lean_driver_cpu_s_per_trial"] == 0.055  # the dearer size
    assert got["geosweep_lean_vs_raytune_5s"] == round(23 / 25, 3)
    table = "\n".join(out)
    assert "8 x ~5 s" in table and "32 x ~1 s" in table and "<= 0.07" in table


def test_trial_figures_and_the_cpu_trace_of_a_process():
    """The trace reads a real process's CPU (a busy loop of ~0.6 s); the figures are taken
    between the first trial's start and the last one's end."""
    b = _bench()
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
        "time.sleep(0.3)")])
    cpu = b._CpuTrace(proc.pid, every=0.02)
    proc.wait(30)
    t_exit = time.time()
    cpu.close()
    assert cpu.points and cpu.points[-1][1] >= 0.4  # whole process
    assert cpu.points[-1][2] >= 0.4  # its main thread did the work
    row: dict = {}
    start, end = cpu.points[0][0], cpu.points[-1][0]
    b._trial_figures(row, t0, t_exit, [(start, start), (start, end)], cpu)
    assert row["time_to_first_trial_s"] >= 0 and row["teardown_s"] >= 0
    # one "trial" ended after the middle one: the ~0.6 CPU-s between them
    assert 0.4 <= row["driver_cpu_s_per_trial"] <= 0.8


def test_the_lean_arm_is_the_same_spec_with_the_curve_at_reports_only():
    """The lean arm differs from the geosweep arm only in ``budget.curve_every: 0``, and both
    are valid sweep specs."""
    from orchestrator.spec.yaml_reader import spec_from_dict

    b = _bench()
    full, lean = (b.geosweep_spec(8, 500, "peers", 2, lean=x) for x in (False, True))
    assert {**full, "budget": {**full["budget"], "curve_every": 0}} == lean
    assert spec_from_dict(full).base_config().train.curve_every == 1
    assert spec_from_dict(lean).base_config().train.curve_every == 0
