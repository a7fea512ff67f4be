"""`hydra/launcher=packed` with engine=vllm: the cells on one base share one vLLM, an adapter slot each, and the
requests of a round are one `generate` call (rlvr/engine/vllm.py "Packed grids"); each cell writes the very rows
its run alone writes (timing fields aside), as with engine=pytorch (test_packed_grid.py). Two conditions × two
seeds: each seed's warm-up is a base of its own, so the pack holds two vLLMs, two cells on each."""

import pytest
from pack.test_packed_grid import JOBS, STEPS, alone_and_packed, comparable

pytestmark = pytest.mark.vllm  # tests/conftest.py: skipped, saying why, where vLLM is not installed


def test_cells_sharing_a_vllm_write_the_rows_of_their_runs_alone(tmp_path):
    alone, packed, output = alone_and_packed(tmp_path, ["engine=vllm"])
    for number, rows in enumerate(alone):
        assert comparable(packed / str(number)) == rows, f"job {number} {JOBS[number]}"
    assert "pack 1 of 1: jobs 0, 1, 2, 3" in output
    requests = len(JOBS) * (STEPS + 3)  # its steps and its 3 evaluations (before, after step 3, after the last)
    assert f"{requests} of {requests} sampling requests decoded together" in output
