"""The warm local Ray of `geosweep ray start | status | stop` (cluster/warm.py)."""

from __future__ import annotations

import json
import os

import pytest
from listening import describe, is_loopback, listening, process_tree

from cluster import warm


@pytest.fixture()
def state(tmp_path, monkeypatch):
    path = tmp_path / "ray.json"
    monkeypatch.setenv("GEOSWEEP_RAY_STATE", str(path))
    return path


def test_no_or_stale_record_is_no_warm_ray(state):
    assert warm.current() is None
    state.write_text("not json")
    assert warm.current() is None
    # a record whose process is gone (this pid can't be a live Ray: pid 2**22 + 1 > pid_max)
    state.write_text(json.dumps({"address": "127.0.0.1:1", "pid": 2**22 + 1}))
    assert warm.current() is None
    assert warm.stop() is False and not state.exists()  # the stale record is removed
    # a live process (this one) but a port nobody answers on: still not a Ray
    state.write_text(json.dumps({"address": "127.0.0.1:1", "pid": os.getpid()}))
    assert warm.current() is None


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_start_join_status_stop(state, capsys):
    import orchestrator.cli as ocli

    assert ocli.main(["ray", "status"]) == 3
    try:
        assert ocli.main(["ray", "start", "--num-cpus", "1"]) == 0
        rec = warm.current()
        assert rec is not None and rec["address"].startswith("127.0.0.1:")
        assert ocli.main(["ray", "start"]) == 0  # idempotent: the same Ray
        assert warm.current()["pid"] == rec["pid"]
        assert "already running" in capsys.readouterr().out
        assert ocli.main(["ray", "status"]) == 0
        # every server of the warm Ray on loopback (issue 15 section 6; test_loopback.py)
        rows = listening(process_tree(rec["pid"]))
        assert {"gcs_server", "raylet"} <= {comm for _, comm, _, _ in rows}, describe(rows)
        assert all(is_loopback(host) for _, _, host, _ in rows), describe(rows)
    finally:
        assert ocli.main(["ray", "stop"]) == 0
    assert warm.current() is None and not state.exists()
    assert not os.path.exists(rec["temp_dir"])
    assert ocli.main(["ray", "stop"]) == 0
    assert "no local Ray running" in capsys.readouterr().out


def test_bad_num_cpus_is_one_line(state, capsys):
    import orchestrator.cli as ocli

    assert ocli.main(["ray", "start", "--num-cpus", "zero"]) == 2
    assert "--num-cpus: 'zero' is not a positive whole number" in capsys.readouterr().err
