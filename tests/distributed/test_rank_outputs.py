"""A rank other than 0 writes nothing into the run folder: its RunDir (`RunDir.of` on rank 1) reads and writes
nothing (two ranks truncating metrics.jsonl at once on a resume raced over its temporary file)."""

from rlvr.distributed import ONE_PROCESS, World
from rlvr.outputs import RunDir


def test_a_rundir_that_does_not_write_leaves_the_folder_as_it_was(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 2.0}\n')
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = RunDir.of(tmp_path, World(rank=1, size=2, local_rank=1))
    out.append("metrics.jsonl", {"step": 2, "loss": 3.0})
    out.write_samples(2, [{"prompt": "1+1="}])
    out.write_json("summary.json", {"steps": 3})
    out.write_status("running", max_steps=3)
    out.truncate(1)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2
    RunDir.of(tmp_path, ONE_PROCESS).truncate(1)  # rank 0's does cut it back
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
