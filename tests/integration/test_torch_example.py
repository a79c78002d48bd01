"""The PyTorch example trainable on a real local Ray: two trials sharing one (logical) GPU at 0.5
each."""

from __future__ import annotations

import pytest

from airflow_trials import Trial, TrialRunner, TrialStatus, load_checkpoint

torch = pytest.importorskip(
    "torch",
    reason="the PyTorch example needs torch: pip install -c constraints.txt '.[torch]' "
    "(.ci/run installs it)",
)


def test_two_trials_at_half_a_gpu_each_learn_and_checkpoint(ray_cluster, storage):
    trials = [
        Trial(
            "airflow_trials.examples.torch_mlp:train",
            {"lr": lr, "hidden": 32, "n_samples": 1500, "seed": 1},
            experiment_name="torch-exp",
            resources={"cpu": 0.5, "gpu": 0.5},
            stopping_criterion={"training_iteration": 12},
        )
        for lr in (0.01, 0.03)
    ]
    runner = TrialRunner("torch-exp", storage_path=storage, wait_timeout_s=10.0)
    for trial in trials:
        runner.add_trial(trial)
    runner.run()

    for trial in trials:
        assert trial.status is TrialStatus.TERMINATED, trial.error_msg
        result = trial.last_result
        assert result["training_iteration"] == 12
        # Spirals are not linearly separable: the MLP learnt them.
        assert result["val_accuracy"] > 0.85, result
        # Ray gave the trial one GPU id (logical here: no CUDA, so it trained on the CPU).
        assert len(result["visible_gpus"].split(",")) == 1 and result["on_cuda"] == int(
            torch.cuda.is_available()
        )
        saved = load_checkpoint(trial.checkpoint.path)
        assert saved["epoch"] == 12 and all(t.device.type == "cpu" for t in saved["model"].values())
