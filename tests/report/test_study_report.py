"""Study and profile reports from a tiny real study."""

from __future__ import annotations

import pathlib
import re

import optuna
import pytest
import yaml

from tuner.errors import ConfigError, StudyNotFound
from tuner.report import load_report_data, study_report, write_page
from tuner.report.study_report import param_importances


def _charts(html: str) -> int:
    return html.count('<svg xmlns="http://www.w3.org/2000/svg"')


def _section(html: str, anchor: str) -> str:
    m = re.search(rf'<section id="{anchor}">(.*?)</section>', html, re.S)
    assert m, f"no section {anchor}"
    return m.group(1)


@pytest.fixture(scope="module")
def full_html(small_study: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("html") / "report.html"
    steps: list[str] = []
    write_page(study_report(profile=small_study, on_step=steps.append), out)
    assert any("replaying baseline on the train window" in s for s in steps)
    return out.read_text()


def test_data_from_the_study(small_study: pathlib.Path) -> None:
    data = load_report_data(profile=small_study)
    assert data.study_name == "small" and data.storage.endswith("small.optuna-journal")
    assert len(data.trials) == 8
    assert data.baseline is not None and data.baseline.is_baseline
    assert data.chosen is not None
    assert data.chosen.settings == data.profile.scheduler.to_dict()
    assert data.front and all(p in data.stage2 for p in data.front)
    assert data.baseline.holdout and data.chosen.holdout  # held-out replays were stored


def test_full_report_has_every_part(full_html: str) -> None:
    html = full_html
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    for anchor in ("summary", "pareto-front", "trial-history", "parameter-importance",
                   "baseline-vs-tuned", "time-series"):
        _section(html, anchor)
    assert "1 / (90th percentile over requests of the per-request mean" in html
    front = _section(html, "pareto-front")
    assert _charts(front) == 2  # training window + held-out window
    assert 'data-label="baseline (vLLM defaults)"' in front and 'data-label="recommended"' in front
    assert _charts(_section(html, "trial-history")) == 2  # one per objective
    cmp_ = _section(html, "baseline-vs-tuned")
    assert "replaying the baseline and the recommended settings now through tuner.replay.run" in cmp_
    assert _charts(cmp_) == 2 + 4  # hit rate, preemptions; TTFT and ITL CDFs x 2 windows
    assert _charts(_section(html, "time-series")) == 4
    # every chart has a title, both axis labels and a caption
    figures = re.findall(r"<figure>(.*?)</figure>", html, re.S)
    assert len(figures) == _charts(html)
    for f in figures:
        assert "<h3>" in f and "<figcaption>" in f
        assert 'class="xlabel"' in f and 'class="ylabel"' in f


def test_importance_notes_few_trials(small_study: pathlib.Path) -> None:
    data = load_report_data(profile=small_study)
    imps, notes = param_importances(data)
    assert set(imps) == {"p90_interactivity", "output_throughput_per_gpu"}
    for v in imps.values():
        assert sum(v.values()) == pytest.approx(1.0)
    assert any("Only 8 completed trials" in n for n in notes)


def test_importance_with_too_few_trials(tmp_path: pathlib.Path) -> None:
    storage = f"{tmp_path}/one.optuna-journal"
    from tuner.tune import open_storage

    st = optuna.create_study(study_name="one", storage=open_storage(storage),
                             directions=["maximize", "maximize"])
    st.enqueue_trial({"x": 1.0})
    st.optimize(lambda t: (t.suggest_float("x", 0, 2), 1.0), n_trials=1)
    data = load_report_data(study="one", storage=storage)
    imps, notes = param_importances(data)
    assert imps == {} and "at least 2 completed trials" in notes[0]
    page = study_report(study="one", storage=storage)  # no stage 2, no trace: still a page
    html = page.render()
    assert "The stage-2 study (training-window replays) is missing" in html
    assert "No trace charts: the study's trace and target are unknown" in html
    assert "no replay was run" in html


def test_no_replay_uses_stored_metrics(small_study: pathlib.Path) -> None:
    html = study_report(profile=small_study, replay=False, include_trace=False).render()
    cmp_ = _section(html, "baseline-vs-tuned")
    assert "metrics stored by the study/profile" in cmp_ and "--no-replay was given" in cmp_
    assert "No replays, so no time series" in _section(html, "time-series")
    assert _charts(cmp_) == 2  # hit rate and preemptions only, from stored metrics


def test_profile_without_its_journal(small_study: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # The journal moved away: neither the provenance path nor the file beside the profile.
    data = yaml.safe_load(small_study.read_text())
    data["provenance"]["study"]["storage"] = str(tmp_path / "gone.optuna-journal")
    lone = tmp_path / "lone.yaml"
    lone.write_text(yaml.safe_dump(data))
    data = load_report_data(profile=lone)
    assert data.study is None and data.front  # Pareto set from the profile
    html = study_report(profile=lone).render()
    assert "The study's storage was not found" in html
    assert "Parameter importance needs the trials" in html or "No study storage" in html
    assert _charts(_section(html, "pareto-front")) >= 1


def test_study_by_name_and_errors(small_study: pathlib.Path) -> None:
    journal = str(small_study.with_suffix(".optuna-journal"))
    data = load_report_data(study="small", storage=journal)
    assert data.chosen is not None and data.profile is None
    with pytest.raises(StudyNotFound, match="no study 'nope'.*existing: small"):
        load_report_data(study="nope", storage=journal)
    with pytest.raises(ConfigError, match="needs a profile or --storage"):
        load_report_data()
