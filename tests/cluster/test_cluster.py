"""A real two-node Ray cluster on this machine: `geosweep submit` a sweep and check where it ran.

Head (1 CPU, dashboard/Jobs API on 127.0.0.1) + a second node (1 CPU, custom resource
``node2``; both nodes on 127.0.0.1, loopback only, told apart in the trials table by node id)
+ a lean MLflow server, all with Ray token auth on and a test-only token
(``~/.ray/auth_token`` is never read or written). Two sweeps run at once, one pinned to each
node through the spec's ``resources.custom``. Every process is stopped by its own handle
(context managers); a bare ``ray stop`` is never used.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
import yaml
from ray_services import mlflow_server, ray_head, ray_worker, wait_for_nodes

from cluster import jobs

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(600)]



def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``geosweep ARGV`` in-process, with the cluster commands registered (whether or not
    orchestrator/cli/__init__.py already wires them): (exit code, stdout, stderr)."""
    import orchestrator.cli as ocli  # registers the cluster commands itself

    capsys.readouterr()
    rc = ocli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


SPEC = {
    "name": "cluster-smoke",
    "workload": {"preset": "gpt-debug", "overrides": {"train.eval_iters": 1}},
    "space": {"optim.lr": {"grid": [0.003, 0.02]}},
    "seeds": [0],
    "search": {"algorithm": "grid", "max_concurrent": 2, "metric": "val/loss", "mode": "min"},
    "budget": {"steps": 20, "eval_every": 10, "metrics_every": 0},
    # Pinned by a custom resource only the head has: Ray/Tune do not promise to spread one
    # sweep's trials (2 of ~8 unpinned runs put both trials on the head), so the placement
    # on both nodes is made deterministic with spec `resources.custom` -> Ray resources.
    "resources": {"workers_per_trial": 1, "cpus_per_worker": 1.0, "max_failures": 0,
                  "custom": {"head_slot": 1}},
}
# The same workload pinned to the second node; runs at the same time as SPEC.
SPEC2 = {**SPEC, "name": "cluster-smoke-node2", "space": {"optim.lr": {"grid": [0.01]}},
         "resources": {**SPEC["resources"], "custom": {"node2": 0.5}}}


def test_submit_sweep_to_two_node_cluster(tmp_path: Path, monkeypatch, capsys):
    token = secrets.token_hex(24)
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)  # the client side: what a user exports
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    spec = tmp_path / "cluster_smoke.yaml"  # outside the repo: exercises the staged upload
    spec.write_text(yaml.safe_dump(SPEC))
    spec2 = tmp_path / "cluster_smoke_node2.yaml"
    spec2.write_text(yaml.safe_dump(SPEC2))
    out = tmp_path / "runs"
    t0 = time.time()
    # Started without waiting for each other: on 2 loaded cores each takes 10-40 s.
    with mlflow_server(root=tmp_path / "mlflow", wait=False) as ml, \
            ray_head(num_cpus=1, resources={"head_slot": 1}, env=ray_env,
                     wait_dashboard=False) as head, \
            ray_worker(head.gcs_address, num_cpus=1, resources={"node2": 1}, env=ray_env):
        addr = head.dashboard_url
        nodes = wait_for_nodes(addr, 2, headers=jobs.auth_headers())
        assert len(nodes) == 2
        ml.wait_ready()
        t_up = time.time() - t0
        print(f"cluster + MLflow up in {t_up:.0f}s")

        # Without the token the Jobs API refuses: one line, exit code 2, token not echoed.
        monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong-" + token[:8])
        rc, _, err = run_cli(["jobs", "--address", addr], capsys)
        assert rc == 2 and err.count("\n") == 1 and "token" in err
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)

        rc, _, se = run_cli(["submit", str(spec2), "--address", addr, "--out", str(out),
                             "--mlflow-uri", ml.uri, "--job-id", "gs-cluster-node2"], capsys)
        assert rc == 0, se
        # --wait follows the job's logs (the SDK's websocket tail) until it ends
        rc, so, se = run_cli(["submit", str(spec), "--address", addr, "--out", str(out),
                              "--mlflow-uri", ml.uri, "--job-id", "gs-cluster-smoke", "--wait"],
                             capsys)
        st = jobs.status("gs-cluster-smoke", addr)
        log = "".join(jobs.logs("gs-cluster-smoke", addr))
        assert rc == 0 and st == "SUCCEEDED", (se, log[-4000:])
        assert "submitted job gs-cluster-smoke" in so and "[geosweep] finished" in so
        assert so.rstrip().endswith("job gs-cluster-smoke: SUCCEEDED")
        t_job = time.time() - t0 - t_up

        # job status and logs through the CLI
        rc, so, se = run_cli(["jobs", "--address", addr], capsys)
        assert rc == 0 and "gs-cluster-smoke" in so and "SUCCEEDED" in so
        rc, so_logs, _ = run_cli(["logs", "gs-cluster-smoke", "--address", addr], capsys)
        assert rc == 0 and "[geosweep] finished" in so_logs and "2 completed" in so_logs
        rc, so_stop, _ = run_cli(["stop", "gs-cluster-smoke", "--address", addr], capsys)
        assert rc == 0 and "not running" in so_stop and "SUCCEEDED" in so_stop
        rc, _, err = run_cli(["logs", "no-such-job", "--address", addr], capsys)
        assert rc == 2 and err.count("\n") == 1
        for text in (so, se, so_logs, so_stop, log, err):
            assert token not in text

        # A shipped spec by NAME (travels as the name, runs from the uploaded checkout); stop it
        # through the CLI while it runs.
        rc, so, se = run_cli(["submit", "quickstart", "--address", addr, "--out", str(out),
                              "--job-id", "gs-cluster-stop"], capsys)
        assert rc == 0, se
        deadline = time.time() + 120
        seen = ""
        while "[geosweep] sweep 'quickstart'" not in seen and time.time() < deadline:
            time.sleep(2)
            seen = "".join(jobs.logs("gs-cluster-stop", addr))
        assert "[geosweep] sweep 'quickstart'" in seen, seen[-3000:]
        rc, so_stop, _ = run_cli(["stop", "gs-cluster-stop", "--address", addr], capsys)
        assert rc == 0 and "stop requested" in so_stop
        assert jobs.wait("gs-cluster-stop", addr, timeout=60, poll_s=1) == "STOPPED"
        assert token not in seen + so + se + so_stop

        # results: Parquet (node of every trial) and the MLflow server (parent + 2 children)
        from orchestrator.store.parquet import read_trials

        trials = read_trials(str(out / "cluster-smoke" / "parquet"), sweep="cluster-smoke")
        assert len(trials) == 2
        assert set(trials["status"]) == {"completed"}
        assert jobs.wait("gs-cluster-node2", addr, timeout=180, poll_s=2) == "SUCCEEDED"
        trials2 = read_trials(str(out / "cluster-smoke-node2" / "parquet"),
                              sweep="cluster-smoke-node2")
        assert list(trials2["status"]) == ["completed"]
        head_nodes, node2_nodes = set(trials["node"]), set(trials2["node"])
        assert len(head_nodes) == 1 and len(node2_nodes) == 1, (head_nodes, node2_nodes)
        # both nodes are 127.0.0.1; the node id (recorded by the worker) tells them apart
        assert head_nodes != node2_nodes, (head_nodes, node2_nodes)
        assert all(":127.0.0.1/" in n for n in head_nodes | node2_nodes)

        from mlflow import MlflowClient

        mc = MlflowClient(ml.uri)
        exp = mc.get_experiment_by_name("cluster-smoke")
        assert exp is not None
        runs = mc.search_runs([exp.experiment_id])
        roles = sorted(r.data.tags.get("geosweep.role", "") for r in runs)
        assert roles == ["child", "child", "parent"]
        parent = next(r for r in runs if r.data.tags["geosweep.role"] == "parent")
        children = [r for r in runs if r.data.tags["geosweep.role"] == "child"]
        assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
        assert all("Loss/val" in c.data.metrics for c in children)
        assert sorted(trials["optim.lr"].astype(float)) == [0.003, 0.02]
        # the same trials, with the same final validation loss, in Parquet and in MLflow
        pq = dict(zip(trials["trial"], trials["final_val_loss"]))
        assert sorted(pq) == sorted(c.data.tags["geosweep.trial_id"] for c in children)
        for c in children:
            assert c.data.metrics["Loss/val"] == pytest.approx(pq[c.data.tags["geosweep.trial_id"]])
        head_proc, head_tmp = head.proc, head.temp_dir
    print(f"cluster up {t_up:.0f}s, job {t_job:.0f}s, total {time.time() - t0:.0f}s")
    assert head_proc.poll() is not None
    assert not Path(head_tmp).exists()
