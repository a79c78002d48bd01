"""The s3 extra: s3:// checkpoint storage installs from the pins and in both images
(docs/deploy.md)."""

from __future__ import annotations

import pathlib
import re
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def _stage_installs() -> dict[str, list[str]]:
    """Each Dockerfile stage's ``pip install`` lines."""
    stages: dict[str, list[str]] = {}
    stage = None
    for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines():
        if match := re.match(r"FROM \S+ AS (\S+)", line):
            stage = match.group(1)
            stages[stage] = []
        elif stage and line.startswith("RUN pip install"):
            stages[stage].append(line)
    return stages


def test_the_s3_extra_is_s3fs_and_the_default_install_and_dev_go_without_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert [re.split(r"[<>=\[]", r)[0] for r in extras["s3"]] == ["s3fs"]
    installed_by_default = [
        re.split(r"[<>=\[]", r)[0] for r in project["dependencies"] + extras["dev"]
    ]
    assert "s3fs" not in installed_by_default


def test_s3fs_is_pinned_at_the_pinned_fsspec_version_with_what_it_brings():
    pins = _pins()
    # s3fs releases track fsspec's version and require exactly it.
    assert pins["s3fs"] == pins["fsspec"]
    for dependency in ("aiobotocore", "botocore", "aioitertools", "jmespath"):
        assert dependency in pins, f"{dependency} (needed by s3fs) is not pinned in constraints.txt"
    # Every botocore requires python-dateutil < 3: a pin of 3 or later makes the extra
    # uninstallable.
    assert int(pins["python-dateutil"].split(".")[0]) < 3


def test_both_images_install_the_s3_extra_with_the_constraints():
    stages = _stage_installs()
    assert set(stages) == {"airflow", "ray"}
    for stage, installs in stages.items():
        assert len(installs) == 1, (stage, installs)
        (install,) = installs
        assert "-c " in install and "constraints.txt" in install, install
        extras = re.search(r"airflow-trials\[([^\]]*)\]", install)
        assert extras and "s3" in extras.group(1).split(","), (
            f"the {stage} image does not install the s3 extra: {install}"
        )


def test_an_s3_storage_opens_without_reaching_the_bucket():
    """The triggerer builds a TrialStorage for the connection's storage_path: with s3fs installed,
    that needs no credentials and sends no request (docs/deploy.md, "Checkpoints in a bucket")."""
    pytest.importorskip("s3fs")
    from airflow_trials.storage.trial_storage import TrialStorage

    storage = TrialStorage("s3://no-such-bucket/trials")
    assert type(storage.fs).__name__ == "S3FileSystem"
    assert storage.fs._s3 is None  # s3fs makes its client on the first request
    assert (
        storage.checkpoint_dir("exp", "t1", 3)
        == "s3://no-such-bucket/trials/exp/t1/checkpoint_000003"
    )
