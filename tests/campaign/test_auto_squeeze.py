"""Auto-squeeze (rlvr/campaign.py): the first run of a campaign to finish records its adapter's recommended
rank in manifest.json, once; its logger's summary gets it too. The smoke campaign test covers it end to end."""

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlvr.campaign import MANIFEST, record
from rlvr.logger.wandb import WandbLogger, run_id


class FakeLogger:
    """Stands for logger=wandb in a run's .hydra/config.yaml; Hydra imports it as `test_auto_squeeze` (a
    second copy of this module), so it leaves what it was given in a file."""

    def __init__(self, project: str) -> None:
        self.project = project

    def update_summary(self, folder: Path, values: dict) -> None:
        with open(folder.parent.parent / "summaries.jsonl", "a") as f:
            f.write(json.dumps({"folder": str(folder), **values}) + "\n")


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def finished_run(folder: Path, true_rank: int, logger: str = "test_auto_squeeze.FakeLogger") -> Path:
    """A run folder as a LoRA r = 8 run leaves it: checkpoints/step_2/ with the adapter, `latest`, the config."""
    g = torch.Generator().manual_seed(0)
    ckpt = folder / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    lora_B = torch.randn(32, 8, generator=g)
    lora_B[:, true_rank:] = 0  # B·A has rank `true_rank`
    save_file({"m.lora_A.weight": torch.randn(8, 16, generator=g), "m.lora_B.weight": lora_B},
              str(ckpt / "adapter_model.safetensors"))
    (ckpt / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    (ckpt / "trainer_state.json").write_text("{}")
    (folder / "checkpoints" / "latest").write_text("step_2\n")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(f"logger:\n  _target_: {logger}\n  project: p\n")
    return folder


def campaign(root: Path, auto_squeeze: dict | None, folders: list[Path]) -> None:
    runs = [{"folder": str(f), "state": "running"} for f in folders]
    (root / MANIFEST).write_text(json.dumps({"auto_squeeze": auto_squeeze, "runs": runs}))


def test_the_first_finisher_records_the_recommendation_once(tmp_path):
    first, second = finished_run(tmp_path / "a" / "seed=0", 2), finished_run(tmp_path / "a" / "seed=1", 4)
    campaign(tmp_path, {"threshold": 0.95}, [first, second])
    record(tmp_path, first, "finished")
    record(tmp_path, second, "finished")
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    squeeze = manifest["squeeze"]
    # first run: one layer of true rank 2 inside r = 8 → V(1) < 1, V(2) = V(4) = V(8) = 1 → rank 2
    assert squeeze["state"] == "done" and squeeze["run"] == str(first) and squeeze["recommended_rank"] == 2
    assert squeeze["adapter"] == str(first / "checkpoints" / "step_2")
    assert (squeeze["threshold"], squeeze["source_rank"], squeeze["num_layers"]) == (0.95, 8, 1)
    assert list(squeeze["mean_variance"]) == ["1", "2", "4", "8"] and squeeze["mean_variance"]["2"] > 0.999999
    assert {r["state"] for r in manifest["runs"]} == {"finished"}
    summaries = [json.loads(x) for x in (tmp_path / "summaries.jsonl").read_text().splitlines()]
    assert len(summaries) == 1 and summaries[0]["folder"] == str(first)  # the second finisher saw the key
    assert summaries[0]["squeeze/recommended_rank"] == 2 and summaries[0]["squeeze/min_variance_retention"] == 0.95
    assert summaries[0]["squeeze/mean_variance/r2"] > 0.999999


def test_off_failed_runs_and_runs_without_an_adapter(tmp_path):
    run = finished_run(tmp_path / "a" / "seed=0", 2)
    campaign(tmp_path, None, [run])
    record(tmp_path, run, "finished")
    assert "squeeze" not in json.loads((tmp_path / MANIFEST).read_text())  # auto_squeeze: null → off

    campaign(tmp_path, {"threshold": 0.95}, [run])
    record(tmp_path, run, "failed", "boom")
    assert "squeeze" not in json.loads((tmp_path / MANIFEST).read_text())  # only a finished run is squeezed

    full = tmp_path / "b" / "seed=0" / "checkpoints" / "step_2"
    full.mkdir(parents=True)
    (full / "model.safetensors").write_bytes(b"")  # model.lora=null: full weights
    (full / "trainer_state.json").write_text("{}")
    campaign(tmp_path, {"threshold": 0.95}, [full.parents[1]])
    record(tmp_path, full.parents[1], "finished")  # never raises: the run has finished whatever happens here
    squeeze = json.loads((tmp_path / MANIFEST).read_text())["squeeze"]
    assert squeeze["state"] == "skipped" and "full weights" in squeeze["reason"]


def test_a_logger_that_fails_does_not_lose_the_manifest_entry(tmp_path):
    run = finished_run(tmp_path / "a" / "seed=0", 2, logger="no.such.Logger")
    campaign(tmp_path, {"threshold": 0.95}, [run])
    record(tmp_path, run, "finished")
    assert json.loads((tmp_path / MANIFEST).read_text())["squeeze"]["recommended_rank"] == 2


def test_wandb_update_summary_reaches_the_folders_own_run(tmp_path):
    folder = tmp_path / "run"
    WandbLogger("p", None, "offline", str(tmp_path)).update_summary(folder, {"squeeze/recommended_rank": 2})
    (log,) = (tmp_path / "wandb").glob(f"offline-run-*/run-{run_id(folder)}.wandb")  # the run of that folder
    # the summary record, in wandb's own run log; wandb's service process may still be writing it when finish()
    # has returned (seen once: the file held only its 7-byte header)
    deadline = time.monotonic() + 30
    while b"squeeze/recommended_rank" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"squeeze/recommended_rank" in log.read_bytes()
