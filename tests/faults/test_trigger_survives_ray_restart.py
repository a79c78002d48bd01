"""A Ray head restart under a process that runs triggers, as the triggerer does.

Before the fix, Ray's GlobalStateAccessor aborted such a process ("WrongClusterID: Perhaps the
client is accessing GCS after it has restarted"), taking every deferred task of every DAG down.
Here one process watches a running trial, the head is SIGKILLed and started again at the same
address about 15 s later, and the same process must: end the watch with an ERROR event that
says the trial was lost to infrastructure, reconnect to the new cluster, and resume the trial
there from its latest checkpoint, with no result lost or repeated.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import shutdown_ray
from tests.faults.stack import RayHead, base_env, wait_for

ITERATIONS = 40

TRIGGERER = r"""
import asyncio, json, sys
from airflow_trials import Trial
from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.triggers.trial_trigger import TrialTrigger

ITERATIONS = int(sys.argv[1])


def say(**fields):
    print(json.dumps(fields), flush=True)


def launch(restore_path=None):
    hook = TrialsHook()
    store = hook.get_store()
    store.upsert_trial("t1", trainable="tests.trainables:counting", config={"sleep": 0.3},
                       resources={"cpu": 1}, max_failures=0)
    trial = Trial("tests.trainables:counting", {"sleep": 0.3}, trial_id="t1",
                  experiment_name="restart", resources={"cpu": 1},
                  stopping_criterion={"training_iteration": ITERATIONS},
                  restore_path=restore_path)
    hook.get_actor_client(verify=True).launch(trial, start_timeout_s=120)
    store.dispose()


async def watch():
    trigger = TrialTrigger("restart", "t1", poll_interval_seconds=0.5,
                           ray_outage_timeout_seconds=150)
    async for event in trigger.run():
        return dict(event.payload)


launch()
say(phase="launched")
say(phase="first_end", event=asyncio.run(watch()))
store = TrialsHook().get_store()
latest = store.reader.latest_checkpoint("t1")
launch(latest.path)
say(phase="resumed", checkpoint_iteration=latest.iteration)
event = asyncio.run(watch())
say(phase="second_end", event=event,
    iterations=[r["training_iteration"] for r in store.reader.get_results("t1")])
"""


def _lines(proc: subprocess.Popen[str], out: list[dict]) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("{"):
            out.append(json.loads(line))


@pytest.mark.timeout(600)
def test_a_process_running_triggers_survives_a_ray_head_restart(tmp_path: Path):
    import threading

    from airflow_trials.store import TrialStore, migrate

    shutdown_ray()
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    migrate(url)
    head = RayHead(base_env(), num_cpus=2)
    head.start()
    head.disconnect()  # this test process must not be a driver of a head it kills
    env = {
        **base_env(),
        "RAY_ADDRESS": head.address,
        "AIRFLOW_TRIALS_DB_URL": url,
        "AIRFLOW_TRIALS_STORAGE": str(tmp_path / "storage"),
    }
    script = tmp_path / "triggerer.py"
    script.write_text(TRIGGERER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ITERATIONS)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "triggerer.err", "w"),
    )
    said: list[dict] = []
    reader = threading.Thread(target=_lines, args=(proc, said), daemon=True)
    reader.start()
    store = TrialStore(url)
    try:
        wait_for(
            lambda: (
                len(store.reader.get_results("t1")) >= 5
                if any(s["phase"] == "launched" for s in said)
                else False
            ),
            240,
            "the trial's first results",
        )
        head.kill()
        time.sleep(15)  # the outage: a new head at the same address about 15 s later
        assert proc.poll() is None, "the process running the trigger died with the Ray head"
        head.start()
        head.disconnect()
        wait_for(
            lambda: any(s["phase"] == "second_end" for s in said) or proc.poll() is not None,
            420,
            "the trial to finish on the new head",
        )
        err = (tmp_path / "triggerer.err").read_text()
        assert proc.wait(timeout=60) == 0, f"the trigger process failed:\n{err[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        store.dispose()
        head.close()

    first = next(s for s in said if s["phase"] == "first_end")["event"]
    assert first["status"] == "ERROR" and first["infrastructure"] is True, first
    assert "Ray cluster restarted" in first["error"] or "Ray did not answer" in first["error"], (
        first
    )
    resumed = next(s for s in said if s["phase"] == "resumed")
    assert resumed["checkpoint_iteration"] >= 5
    second = next(s for s in said if s["phase"] == "second_end")
    assert second["event"]["status"] == "TERMINATED", second
    assert second["iterations"] == list(range(1, ITERATIONS + 1))  # nothing lost, nothing repeated
