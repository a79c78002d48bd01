"""A trial that is a Ray Train run: a ``TorchTrainer`` with 2 data-parallel workers (gloo on the
CPU, NCCL on GPUs) trains the MLP of :mod:`airflow_trials.examples.torch_mlp` on its spirals.

Trainable path: ``airflow_trials.examples.torch_train:train``. Needs PyTorch (the ``torch`` extra)
and Ray Train V2 (on by default since Ray 2.51). The trainable is the Train driver: it starts
the trainer and :class:`~airflow_trials.execution.worker.ray_train.TrialReportCallback` hands
every Train report (rank 0's metrics and checkpoint) to ``airflow_trials.report``, so the trial's
results, checkpoints (keep-N, best) and scheduler verdicts are those of any trial.

Train's workers are those of the trial's ``RayTrainResources`` (``resources_per_trial=
RayTrainResources(driver={"CPU": 0.25}, num_workers=2, resources_per_worker={"CPU": 0.25},
placement_strategy="SPREAD")``: the GPU pool and the runner count them); for a trial with plain
resources, the config keys ``num_workers`` (2), ``use_gpu`` (false), ``cpu_per_worker`` (0.25) and
``placement_strategy`` (``"PACK"``) size them. Other config keys: ``lr``, ``hidden``,
``batch_size``, ``seed``, ``n_samples`` (as torch_mlp),
``train_max_failures`` (2: how often Train restarts its workers from its latest checkpoint when one
dies, as its ``FailureConfig``; past that the trial fails) and ``epochs`` (1000: give the trial a
stopping criterion). Each result carries ``loss`` (the validation loss), ``val_accuracy``,
``epoch``, ``world_size`` (the workers that trained it) and ``worker_node_ids`` (the Ray nodes they
ran on). Each checkpoint is a directory holding
``state.pt`` (the model's and optimizer's state and the epoch); a trial resumed from one continues
at the next epoch.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import airflow_trials
from airflow_trials.examples.torch_mlp import evaluate, fit_epoch, mlp, spirals

_STATE_FILE = "state.pt"


def train(config: dict[str, Any]) -> None:
    """The trial's trainable: run the Train loop on ``num_workers`` workers, resuming from the
    trial's checkpoint when it has one."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from airflow_trials import TrialReportCallback, trial_scaling_config

    resume_from = airflow_trials.get_checkpoint()  # a directory this loop wrote, or None
    if isinstance(airflow_trials.get_trial_resources(), airflow_trials.RayTrainResources):
        scaling = trial_scaling_config()  # the workers the trial declared (and pools count)
    else:
        scaling = ScalingConfig(
            num_workers=int(config.get("num_workers", 2)),
            use_gpu=bool(config.get("use_gpu", False)),
            resources_per_worker={"CPU": float(config.get("cpu_per_worker", 0.25))},
            placement_strategy=str(config.get("placement_strategy", "PACK")),
        )
    callback = TrialReportCallback()
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={**config, "resume_from": resume_from},
        scaling_config=scaling,
        run_config=RunConfig(
            name=airflow_trials.get_trial_id(),
            storage_path=callback.storage_path,
            failure_config=FailureConfig(max_failures=int(config.get("train_max_failures", 2))),
            callbacks=[callback],  # type: ignore[list-item]  # typed as Train V1 RunConfig
        ),
    )
    callback.fit(trainer)


def _train_loop(config: dict[str, Any]) -> None:
    """Runs on each Train worker: one epoch over this worker's shard per report."""
    import ray
    import ray.train
    import ray.train.torch
    import torch
    from torch import nn

    node_id = ray.get_runtime_context().get_node_id()
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    seed = int(config.get("seed", 0))
    torch.manual_seed(seed)
    x_train, y_train, x_val, y_val = spirals(torch, int(config.get("n_samples", 2000)), seed)
    model = mlp(nn, int(config.get("hidden", 32)))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 0.01)))
    start = _load(torch, model, optimizer, config.get("resume_from"))
    model = ray.train.torch.prepare_model(model)  # DistributedDataParallel over the workers
    x_train, y_train = x_train[rank::world_size], y_train[rank::world_size]
    loss_fn = nn.CrossEntropyLoss()
    batch_size = int(config.get("batch_size", 64))
    for epoch in range(start + 1, int(config.get("epochs", 1000)) + 1):
        fit_epoch(torch, model, optimizer, loss_fn, x_train, y_train, batch_size)
        loss, val_accuracy = evaluate(torch, model, loss_fn, x_val, y_val)
        metrics = {
            "loss": loss,
            "val_accuracy": val_accuracy,
            "epoch": epoch,
            "world_size": world_size,
            "worker_node_id": node_id,  # the callback gathers every worker's: worker_node_ids
        }
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if rank == 0:  # one copy of the replicated state
                _save(torch, model, optimizer, epoch, directory)
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=checkpoint)


def _load(torch: Any, model: Any, optimizer: Any, resume_from: str | None) -> int:
    """Load the state of the checkpoint to resume from, if any; the epoch it ended."""
    import ray.train

    latest = ray.train.get_checkpoint()  # Train's own, when it restarted its workers
    directory = latest.path if latest is not None else resume_from
    if directory is None:
        return 0
    state = torch.load(os.path.join(directory, _STATE_FILE))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"])


def _save(torch: Any, model: Any, optimizer: Any, epoch: int, directory: str) -> None:
    unwrapped = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    state = {"model": unwrapped.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    torch.save(state, os.path.join(directory, _STATE_FILE))
