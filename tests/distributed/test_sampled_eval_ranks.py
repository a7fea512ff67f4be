"""A sampled evaluation (trainer.eval_samples=4) over two processes logs the row one process logs: each rank
samples its share of the held-out examples, every example from its own seed, and the batch is gathered."""

from tests.distributed.test_distributed_runs import assert_same_metrics, rows, train

SAMPLED = ["trainer.max_steps=0", "trainer.eval_samples=4", "data.eval_size=16"]


def test_two_ranks_evaluate_by_sampling_as_one_rank_does(tmp_path):
    train(1, tmp_path / "one", *SAMPLED)
    train(2, tmp_path / "two", *SAMPLED)
    (row,) = rows(tmp_path / "one")
    assert row["eval/examples"] == 16 and row["eval/pass@1"] <= row["eval/pass@2"] <= row["eval/pass@4"]
    assert_same_metrics(rows(tmp_path / "two"), rows(tmp_path / "one"))
