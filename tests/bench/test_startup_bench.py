"""bench/startup.py at one round: the default run's start-up is timed, split into phases, and set beside its imports."""


def test_one_round_is_timed_split_and_set_beside_the_imports(run_bench, figure):
    out = run_bench("-m", "bench.startup", "--rounds", "1", "--top", "3", timeout=600)
    first_step = figure(r"process start -> first RL step +([0-9.]+) s", out)
    assert 0 < first_step < 120
    assert figure(r"policy \(imports transformers\) +([0-9.]+) s", out) > 0  # train.log's phase lines were found
    assert 0 < figure(r"import torch +([0-9.]+) s", out) < first_step
    assert 0 < figure(r"imports [0-9.]+ s = ([0-9]+)% of it", out) <= 100
    assert figure(r"(?m)^ +torch +([0-9.]+) s", out) > 0  # the importtime table names torch among the top three
