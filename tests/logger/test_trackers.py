"""logger=mlflow, trackio and tensorboard, and several trackers at once, for real and offline: one packed grid
(tests/logger/conftest.py: tracked_grid) read back with each library's own reader (MLflow's MlflowClient on its
file store, Trackio's SQLite storage, TensorBoard's EventAccumulator)."""

import json
import logging
import shutil
from pathlib import Path

import pytest
from hydra.utils import instantiate

from composing import compose_config
from rlvr.logger.trackers import Trackers
from rlvr.logger.values import flat, numbers

mlflow = pytest.importorskip("mlflow")
trackio = pytest.importorskip("trackio")
pytest.importorskip("tensorboard")
CELLS = ("0", "1")


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def expected(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric of metrics.jsonl as (step, value) pairs, in order: what each tracker must hold."""
    found: dict[str, list[tuple[int, float]]] = {}
    for row in rows(folder):
        for key, value in numbers({k: v for k, v in row.items() if k != "step"}).items():
            found.setdefault(key, []).append((row["step"], value))
    return found


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}


def test_several_trackers_compose_into_one_logger():
    cfg = compose_config(["logger=[wandb,mlflow]", "logger.mode=offline", "logger.experiment=grid"])
    logger = instantiate(cfg.logger)
    assert isinstance(logger, Trackers) and list(logger.loggers) == ["wandb", "mlflow"]
    assert logger.loggers["wandb"].mode == "offline" and logger.loggers["mlflow"].experiment == "grid"
    needs = Trackers.needs(dict(cfg.logger))
    assert [r.item for r in needs.machine] == ["wandb", "wandb key", "wandb server", "mlflow",
                                               "mlflow tracking server"]


@pytest.mark.parametrize("choice", ["logger=[wandb,none]", "logger=[none,wandb]"])
def test_none_is_the_empty_set_of_trackers_and_merges_away_in_a_list(choice, tmp_path):
    """logger=none is no tracker (it builds and takes every call); listed beside trackers it adds nothing."""
    from rlvr.config_check import check_types

    none = compose_config(["logger=none"]).logger
    assert check_types(none, "logger") == [] and Trackers.needs(dict(none)).errors == ()
    quiet = instantiate(none)
    assert isinstance(quiet, Trackers) and quiet.loggers == {}
    quiet.start("run", "group", [], tmp_path, {})
    quiet.log({"step": 0, "loss": 1.0})
    quiet.finish()
    cfg = compose_config([choice, "logger.mode=offline"])
    assert check_types(cfg.logger, "logger") == []
    assert list(instantiate(cfg.logger).loggers) == ["wandb"]


def test_mlflow_holds_each_run_its_params_every_row_and_the_summary(tracked_grid, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when asked

    sweep, _ = tracked_grid
    for cell in CELLS:
        folder = sweep / cell
        stored = json.loads((folder / "mlflow.json").read_text())
        assert stored["tracking_uri"] == (folder / "mlruns").resolve().as_uri()
        client = MlflowClient(tracking_uri=stored["tracking_uri"])
        (run,) = client.search_runs([client.get_experiment_by_name("rlvr").experiment_id])  # resumed: one run
        assert run.info.run_id == stored["run_id"] and run.info.status == "FINISHED"
        assert run.info.run_name == f"grpo+none_s{cell}"
        assert (run.data.tags["condition"], run.data.tags["seed"]) == ("grpo+none", cell)
        params = run.data.params
        assert params["seed"] == cell and params["logger.trackers.mlflow"] == "rlvr.logger.mlflow.MlflowLogger"
        assert params["trainer.max_steps"] == "2"  # a param keeps its first value; config.json is the latest
        latest = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", str(folder))).read_text())
        assert latest["trainer"]["max_steps"] == 3
        assert set(params) == {k for k, _ in flat(latest)}
        for key, points in expected(folder).items():
            assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == points, key
        summary = json.loads((folder / "summary.json").read_text())
        steps = client.get_metric_history(run.info.run_id, "summary/steps")
        assert [(m.step, m.value) for m in steps][-1] == (3, summary["steps"]) == (3, 3)


def trackio_reader(folder: Path, monkeypatch):
    """Trackio's own storage, reading `folder` (Trackio fixes its folder when imported: set here)."""
    from trackio import sqlite_storage, utils

    monkeypatch.setattr(sqlite_storage, "TRACKIO_DIR", folder)
    monkeypatch.setattr(utils, "TRACKIO_DIR", folder)
    return sqlite_storage.SQLiteStorage


def test_trackio_holds_each_run_its_config_every_row_and_the_summary(tracked_grid, monkeypatch):
    sweep, trackio_dir = tracked_grid
    storage = trackio_reader(trackio_dir, monkeypatch)
    assert sorted(storage.get_runs("rlvr")) == [f"grpo+none_s{cell}" for cell in CELLS]  # resumed: no new runs
    for cell in CELLS:
        folder, name = sweep / cell, f"grpo+none_s{cell}"
        assert json.loads((folder / "trackio.json").read_text())["name"] == name
        stored = storage.get_run_config("rlvr", name)
        assert stored["_Group"] == "grpo+none" and stored["seed"] == int(cell)
        logs = [log for log in storage.get_logs("rlvr", name) if not any(k.startswith("summary/") for k in log)]
        for key, points in expected(folder).items():
            assert [(log["step"], log[key]) for log in logs if key in log] == points, key
        summaries = [log for log in storage.get_logs("rlvr", name) if "summary/steps" in log]
        assert (summaries[-1]["step"], summaries[-1]["summary/steps"]) == (3, 3)


def test_tensorboard_holds_each_run_every_row_once_and_the_summary(tracked_grid):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep, _ = tracked_grid
    for cell in CELLS:
        folder = sweep / cell
        events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        assert len(list((folder / "tensorboard").glob("events.out.tfevents.*"))) == 2  # the resume appended
        for key, points in expected(folder).items():
            scalars = events.Scalars(key)  # float32: TensorBoard's own precision
            assert [e.step for e in scalars] == [p[0] for p in points], key
            assert [e.value for e in scalars] == pytest.approx([p[1] for p in points], rel=1e-6), key
        text = events.Tensors("config/text_summary")[-1].tensor_proto.string_val[0].decode()
        assert json.loads(text)["seed"] == int(cell)
        assert [(e.step, e.value) for e in events.Scalars("summary/steps")][-1] == (3, 3)


def test_wandb_beside_them_keeps_one_run_per_folder(tracked_grid):
    sweep, _ = tracked_grid
    ids = [{f.stem for f in (sweep / cell / "wandb").glob("offline-run-*/run-*.wandb")} for cell in CELLS]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]


def test_a_tracker_that_fails_warns_once_and_the_others_go_on(tmp_path, caplog):
    """mlflow's file store vanishes mid-run: one warning, tensorboard still gets every row, a tally at the end."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = instantiate(compose_config(["logger=[mlflow,tensorboard]"]).logger)
    logger.start("x_s0", "x", ["x", "seed0"], tmp_path, {"seed": 0})
    logger.log({"step": 0, "loss": 1.0})
    shutil.rmtree(tmp_path / "mlruns")
    with caplog.at_level(logging.WARNING, logger="rlvr"):
        for step in range(1, 4):
            logger.log({"step": step, "loss": 1.0 / (step + 1)})
        logger.finish()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "logger=mlflow: logging a row failed at step 1" in warned[0], warned
    assert "the training goes on" in warned[0]
    assert warned[1] == ("logger=mlflow failed in this run; 3 row(s) did not reach it (metrics.jsonl holds every "
                         "row)")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [0, 1, 2, 3]


def test_mlflow_params_fit_mlflows_own_limits():
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, _validate_param_name

    from rlvr.logger.mlflow import params

    found = params({"data": {"weird key+[1]": "x" * 7000, "ok.key/a": [1, 2], "none": None}})
    for key in found:
        _validate_param_name(key)  # raises where MLflow would refuse the key
    assert found["data.weird key__1_"] == "x" * (MAX_PARAM_VAL_LENGTH - 3) + "..."
    assert (found["data.ok.key/a"], found["data.none"]) == ("[1, 2]", "null")
