"""The W&B logger, for real, in offline mode (no network, no key)."""

from pathlib import Path

import pytest

from composing import FAST, compose_config
from rlvr.logger.wandb import WandbLogger
from rlvr.run import run

pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def offline_runs(folder: Path) -> list[Path]:
    return sorted((folder / "wandb").glob("offline-run-*"))


def test_naming_and_a_stable_id_per_folder(tmp_path):
    logger = WandbLogger(project="rlvr-test", entity=None, mode="offline", dir=None)
    logger.start("maxrl_gtpo_sepa_s1", "maxrl_gtpo_sepa", ["maxrl_gtpo_sepa", "seed1"], tmp_path / "a", {"seed": 1})
    run_a = logger.run
    assert (run_a.name, run_a.group, tuple(run_a.tags)) == ("maxrl_gtpo_sepa_s1", "maxrl_gtpo_sepa",
                                                              ("maxrl_gtpo_sepa", "seed1"))
    logger.log({"step": 0, "mean_reward": 0.5, "condition": "maxrl+sepa", "loss": float("nan")})
    logger.finish()
    again = WandbLogger(project="rlvr-test", entity=None, mode="offline", dir=None)
    again.start("x", "x", [], tmp_path / "a", {})
    same_id = again.run.id
    again.finish()
    other = WandbLogger(project="rlvr-test", entity=None, mode="offline", dir=None)
    other.start("x", "x", [], tmp_path / "b", {})
    assert same_id == run_a.id and other.run.id != run_a.id
    other.finish()


def test_each_job_in_one_process_gets_its_own_run_and_a_resume_continues_it(tmp_path):
    overrides = FAST + ["logger=wandb", "logger.mode=offline", "trainer.max_steps=2"]
    run(compose_config(overrides), tmp_path / "a")
    run(compose_config(overrides + ["seed=1"]), tmp_path / "b")
    ids = [offline_runs(tmp_path / f)[0].name.rsplit("-", 1)[1] for f in "ab"]
    assert ids[0] != ids[1]
    for folder in "ab":
        run_dir = offline_runs(tmp_path / folder)[0]
        assert (run_dir / f"run-{run_dir.name.rsplit('-', 1)[1]}.wandb").stat().st_size > 0
    run(compose_config(FAST + ["logger=wandb", "logger.mode=offline", "trainer.max_steps=3"]), tmp_path / "a")
    assert {r.name.rsplit("-", 1)[1] for r in offline_runs(tmp_path / "a")} == {ids[0]}  # the same run, continued
