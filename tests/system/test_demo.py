"""The README's main job, run as a newcomer runs it (minus the venv setup the script adds)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_demo_runs_a_real_experiment_and_prints_the_leaderboard(tmp_path):
    from tests.conftest import shutdown_ray

    shutdown_ray()  # the demo starts its own local Ray
    db_url = f"sqlite:///{tmp_path / 'trials.db'}"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_trials.demo",
            "--epochs",
            "3",
            "--num-cpus",
            "2",
            "--storage",
            str(tmp_path),
            "--db-url",
            db_url,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        # A Ray of its own, even when another cluster runs on this machine (another test run's).
        env={**os.environ, "RAY_ADDRESS": "local"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("rank")) + 2
    end = lines.index("", start)
    ranks = [line.split() for line in lines[start:end]]
    assert len(ranks) == 8
    assert all(r[4] == "TERMINATED" and r[5] == "3" for r in ranks)
    losses = [float(r[6]) for r in ranks]
    assert losses == sorted(losses) and losses[0] < 0.69  # better than chance (log 2)
    assert "8 of 8 trials finished" in out.stdout
    assert (tmp_path / "regression-demo" / "experiment_state.json").exists()
    # The run is in the trials DB, where the CLI and the dashboard read it, ranked as printed.
    from airflow_trials import ResultGrid

    grid = ResultGrid.from_db("regression-demo", db_url=db_url)
    assert (len(grid), grid.num_terminated, grid.metric, grid.mode) == (8, 8, "val_loss", "min")
    best = grid.get_best_result(scope="all")
    assert best.trial_id == ranks[0][1]
    assert f"Best trial {best.trial_id}" in out.stdout and best.best_checkpoint in out.stdout
    assert f"airflow-trials leaderboard regression-demo --db-url {db_url}" in out.stdout


def test_demo_joins_a_ray_cluster_started_with_ray_start(tmp_path):
    from tests.conftest import shutdown_ray
    from tests.faults.stack import RayHead, base_env

    shutdown_ray()
    head = RayHead(base_env(), num_cpus=2)
    head.start()
    head.disconnect()  # the demo is the only driver
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_trials.demo",
                "--epochs",
                "2",
                "--num-cpus",
                "2",
                "--storage",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
            # No RAY_ADDRESS: the demo must find the running cluster itself, as `ray start` users
            # expect.
            env={key: value for key, value in base_env().items() if key != "RAY_ADDRESS"},
        )
    finally:
        head.close()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--num-cpus 2 ignored: joining the running Ray cluster" in out.stdout
    assert "8 of 8 trials finished" in out.stdout
