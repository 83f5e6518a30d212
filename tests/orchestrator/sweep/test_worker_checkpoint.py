"""What a trial hands Ray per checkpoint: its newest step only (orchestrator/sweep/worker.py)."""

from __future__ import annotations

import os
import shutil

import pytest

from orchestrator.sweep.worker import _staged
from workloads.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.timeout(60)


def test_reported_folder_holds_only_the_newest_step_and_restores_it(tmp_path):
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, 10, {"step": 10})
    newest = save_checkpoint(folder, 20, {"step": 20})
    assert sorted(os.listdir(folder)) == ["step-00000010", "step-00000020"]  # keep=2 locally
    stages: list[str] = []
    stage = _staged(str(newest), stages)
    try:
        assert stages == [stage] and os.listdir(stage) == ["step-00000020"]
        assert os.listdir(os.path.join(stage, "step-00000020")) == ["state.pt"]
        # hard-linked where the file system allows it: the same bytes, none copied
        assert os.path.samefile(os.path.join(stage, "step-00000020", "state.pt"),
                                newest / "state.pt")
        # a later checkpoint drops step 10 locally; the staged step 20 is unaffected
        save_checkpoint(folder, 30, {"step": 30})
        assert load_checkpoint(os.path.join(stage, "step-00000020"))["step"] == 20
        # a restore copies the persisted folder into a fresh checkpoint folder and resumes
        # from its latest step (worker.py: copytree of the Ray checkpoint)
        restored = tmp_path / "restored"
        shutil.copytree(stage, restored)
        assert latest_checkpoint(restored).name == "step-00000020"
    finally:
        shutil.rmtree(stage, ignore_errors=True)
