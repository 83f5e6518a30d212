"""`geosweep report` never leaves half its outputs (issue 28): a failure at any of its
writes (a full disk here, raised where the file is opened, as a real one would be) exits with
one line naming the file in report/, and report/ is the earlier report byte for byte, with no
temporary folder left beside it."""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
from pathlib import Path

import hostile_kit as kit
import pytest

from orchestrator.cli import main


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> Path:
    """A fake sweep with a first report written."""
    t = tmp_path_factory.mktemp("atomic")
    root = kit.fake_sweep(t)
    assert main(["report", str(root)]) == 0
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fails", ["arms.csv", "trials.csv", "metrics.csv", "leaderboard.csv",
                                   "objective_vs_params.png", "parallel_coordinates.png",
                                   "report.md"])
def test_a_write_failing_half_way_leaves_the_last_report(reported, fails, monkeypatch,
                                                          capsys):
    for f in (reported / "report").iterdir():  # an earlier report that differs from the new one
        f.write_bytes(f.read_bytes() + b"\n# an earlier report\n")
    before = _tree(reported / "report")
    assert fails in before  # the failure lands on a file the report really writes
    real_open = builtins.open

    def full(file, mode="r", *a, **k):
        if any(c in mode for c in "wax") and Path(str(file)).name == fails:
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", full)
    monkeypatch.setattr(io, "open", full)  # pathlib's write_text opens through io.open
    capsys.readouterr()
    code = main(["report", str(reported)])
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(io, "open", real_open)
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"disk full writing {reported / 'report' / fails}" in lines[0], lines[0]
    assert _tree(reported / "report") == before
    assert sorted(p.name for p in reported.iterdir() if p.name.startswith(".report")) == []


@pytest.mark.timeout(120)
def test_a_report_that_succeeds_replaces_the_old_one_whole(reported, capsys):
    stale = reported / "report" / "stale_figure.png"
    stale.write_bytes(b"an older report's figure")
    assert main(["report", str(reported)]) == 0
    assert not stale.exists()
    assert {"report.md", "arms.csv", "trials.csv", "metrics.csv"} <= set(
        _tree(reported / "report"))
