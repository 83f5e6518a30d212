"""A full disk at a checkpoint write is one line naming the file, and no half-written step is
left (issue 15: `train` printed a 36-line traceback, torch's writer raising an opaque
RuntimeError whose context was the ENOSPC).

The disk is "full" after a byte budget: the checkpoint's file object (the only file `train`
writes) raises ENOSPC like a real full disk, so torch's own writer fails as it does there."""

from __future__ import annotations

import builtins
import errno
import io
import re
from pathlib import Path

import pytest

from orchestrator.cli import main


class _FullDisk(io.FileIO):
    budget = 4096  # bytes that still fit

    def write(self, b) -> int:
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(b), self.budget)
        type(self).budget -= n
        return super().write(bytes(b)[:n])


@pytest.mark.timeout(300)
def test_train_checkpoint_on_a_full_disk_is_one_line(tmp_path: Path, capsys, monkeypatch):
    import workloads.checkpoint as ck

    def full_open(path, mode="r", *a, **k):
        if "w" in mode and str(path).endswith("state.pt"):
            return _FullDisk(path, "w")
        return builtins.open(path, mode, *a, **k)

    monkeypatch.setattr(_FullDisk, "budget", 4096)
    monkeypatch.setattr(ck, "open", full_open, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "o"
    code = main(["train", "--preset", "gpt-debug", "--set", "train.steps=4", "--set",
                 "train.eval_every=2", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("geosweep: error: disk full writing ")
    assert re.search(r"writing .*/o/checkpoints/step-\d{8}/state.pt; free space", lines[0])
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert left == [], left  # no .tmp-step-* and no half step
