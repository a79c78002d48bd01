"""The run page shows the version of the data a run tuned on (``tuning_experiment(
data_version=...)``), escaped, and says nothing of one for a run that named none."""

from __future__ import annotations

from markupsafe import escape

from tests.contract.test_store import register
from tests.factories import add_results


def test_the_run_page_shows_the_data_version_the_run_tuned_on(dashboard, trials_store):
    trials_store.ensure_experiment("retune", metric="loss", mode="min")
    tuned = trials_store.create_experiment_run("retune", "r-new-data", data_version="v0008")
    plain = trials_store.create_experiment_run("retune", "r-by-hand")
    hostile = trials_store.create_experiment_run("retune", "r-hostile", data_version="<b>v9</b>")
    for run in (tuned, plain, hostile):
        register(trials_store, f"t-{run}", run)
        add_results(trials_store, f"t-{run}", [{"training_iteration": 1, "loss": 0.5}])
    page = dashboard.get(f"/runs/{tuned}")
    assert page.status_code == 200
    assert 'class="data-version"' in page.text and "<code>v0008</code>" in page.text
    assert "data version" not in dashboard.get(f"/runs/{plain}").text
    assert f"<code>{escape('<b>v9</b>')}</code>" in dashboard.get(f"/runs/{hostile}").text
