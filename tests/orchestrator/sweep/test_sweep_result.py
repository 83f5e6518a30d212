"""SweepResult.lost: the failed records a resumed sweep keeps for trials an earlier driver
crash lost (their slots ran again), which `geosweep resume` does not count as failures."""
from orchestrator.sweep.tuner import ORPHAN_REASON, SweepResult


def test_lost_counts_only_crash_orphans():
    recs = [{"status": "completed"}, {"status": "failed", "error": ORPHAN_REASON},
            {"status": "failed", "error": "RuntimeError: boom"}, {"status": "failed"},
            {"status": "diverged", "error": ORPHAN_REASON}]
    r = SweepResult(paths=None, records=recs, wall_s=1.0)
    assert r.lost == 1
    assert SweepResult(paths=None, records=[], wall_s=0.0).lost == 0
