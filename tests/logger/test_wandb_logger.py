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


def run_ids(folder: Path) -> set[str]:
    """The W&B run ids logged under `folder` (from the `run-<id>.wandb` files: the folder name is not enough,
    wandb adds a suffix when a run is continued within the same second)."""
    return {f.stem.removeprefix("run-") for f in (folder / "wandb").glob("offline-run-*/run-*.wandb")}


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
    (id_a,), (id_b,) = run_ids(tmp_path / "a"), run_ids(tmp_path / "b")
    assert id_a != id_b
    for folder in "ab":
        assert all(f.stat().st_size > 0 for f in (tmp_path / folder / "wandb").glob("offline-run-*/run-*.wandb"))
    run(compose_config(FAST + ["logger=wandb", "logger.mode=offline", "trainer.max_steps=3"]), tmp_path / "a")
    assert run_ids(tmp_path / "a") == {id_a}  # the same run, continued
