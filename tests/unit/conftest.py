"""Unit tests run without a Ray cluster, Ray Tune's classes included (the conformance tests)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_ray_cluster(monkeypatch):
    """A unit test that would start (or join) a Ray cluster fails, whatever ran before it."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("A unit test called ray.init(): unit tests run without a Ray cluster.")

    monkeypatch.setattr(ray, "init", refuse)
