"""`hydra/launcher=packed` with engine=vllm: the cells on one base share one vLLM, an adapter slot each, and the
requests of a round are one `generate` call (rlvr/engine/vllm.py "Packed grids"); each cell writes the very rows
its run alone writes (timing fields aside), as with engine=pytorch (test_packed_grid.py). Two conditions × two
seeds: the built-in model draws its weights from the seed, so each seed is a base of its own."""

import pytest
from pack.test_packed_grid import BASE, GUESS, JOBS, STEPS, alone_and_packed, comparable, train

pytestmark = pytest.mark.vllm  # tests/conftest.py: skipped, saying why, where vLLM is not installed

VLLM = ["engine=vllm"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return alone_and_packed(tmp_path_factory.mktemp("vllm"), VLLM)


def test_cells_sharing_a_vllm_write_the_rows_of_their_runs_alone(runs):
    """One pack of four cells: two vLLMs (a seed each), two cells on each."""
    alone, packed, output = runs
    for number, rows in enumerate(alone):
        assert comparable(packed / str(number)) == rows, f"job {number} {JOBS[number]}"
    assert "pack 1 of 1: jobs 0, 1, 2, 3" in output
    requests = len(JOBS) * (STEPS + 3)  # its steps and its 3 evaluations (before, after step 3, after the last)
    assert f"{requests} of {requests} sampling requests decoded together" in output


def test_packs_one_after_another_each_start_their_own_vllm(runs, tmp_path):
    """pack_size=2 over a seed-major sweep: a pack per seed, one after the other in one process; the second starts
    its vLLM after the first pack shut its own down (one shut down while another runs would break it)."""
    alone, _, _ = runs
    proc = train(["--multirun", "seed=0,1", "condition=grpo,maxrl", *BASE, *VLLM, "hydra/launcher=packed",
                  "hydra.launcher.pack_size=2", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.output[-3000:]
    assert "pack 1 of 2: jobs 0, 1" in proc.output and "pack 2 of 2: jobs 2, 3" in proc.output
    for number, (seed, condition) in enumerate([(s, c) for s in (0, 1) for c in ("grpo", "maxrl")]):
        assert comparable(tmp_path / str(number)) == alone[JOBS.index((condition, seed))], (seed, condition)
    assert proc.output.count("decoded together with other cells' (0 alone") == 2


def test_episodes_of_cells_sharing_a_vllm_write_the_rows_of_their_runs_alone(tmp_path):
    """env=guess: engine=vllm has no turn sampler, so every turn of every cell's episodes is a `sample` call, a
    request of the pack's rounds; two conditions on one seed's vLLM."""
    steps = [*BASE, *GUESS, *VLLM, "seed=0"]
    proc = train(["--multirun", "condition=grpo,maxrl", *steps, "hydra/launcher=packed", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.output[-3000:]
    assert "decoded together with other cells' (0 alone" in proc.output
    for number, condition in enumerate(("grpo", "maxrl")):
        alone = tmp_path / f"alone-{condition}"
        single = train([*steps, f"condition={condition}", f"hydra.run.dir={alone}"])
        assert single.returncode == 0, single.output[-3000:]
        assert comparable(tmp_path / str(number)) == comparable(alone), condition
