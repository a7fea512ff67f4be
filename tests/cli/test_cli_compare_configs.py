"""What `rlvr compare` and `rlvr plot` put side by side: runs are labelled by their composed config (never by
a Hydra choice's name), and runs whose configs differ in more than the condition and the seed are refused,
naming each differing key, its values and a folder holding each, unless `--ignore-key` says it does not
matter."""

import json

import pytest

from rlvr.cli.main import main
from rlvr.cli.runs import load_run
from tests.cli.conftest import make_run


def grid(root, conditions=(("grpo", "none"), ("maxrl", "none")), seeds=(0, 1, 2), config=None):
    """Finished runs of each (algorithm, transform) × seed; `config(algorithm, seed)` → a config override."""
    for algorithm, transform in conditions:
        for seed in seeds:
            make_run(root / f"{algorithm}_{transform}" / f"seed={seed}", seed=seed, algorithm=algorithm,
                     transform=transform, condition_choice=None, steps_done=10,
                     evals={0: 0.1, 10: 0.4 + 0.01 * seed + (0.05 if algorithm == "maxrl" else 0)},
                     config=config(algorithm, seed) if config else None)
    return root


def refused(command, root, capsys, *extra) -> str:
    assert main([command, str(root), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return captured.err


def test_the_label_comes_from_the_config_not_from_the_condition_choice(tmp_path):
    # `condition=grpo algorithm=reinforce_pp` trains REINFORCE++: the choice's name lies
    run = load_run(make_run(tmp_path / "grpo" / "seed=0", seed=0, algorithm="reinforce_pp", transform="none",
                            condition_choice="grpo", steps_done=3))
    assert run.condition == "reinforce_pp+none"
    assert run.config["algorithm"]["_target_"] == "rlvr.algorithm.reinforce_pp.ReinforcePP"  # kept on the record
    # a loss mode other than standard is part of the label
    run = load_run(make_run(tmp_path / "kl" / "seed=0", seed=0, algorithm="grpo", transform="sepa",
                            condition_choice="grpo", steps_done=3, config={"algorithm": {"loss": {"mode": "kl_cov"}}}))
    assert run.condition == "grpo+sepa,loss=kl_cov"
    # no .hydra/config.yaml: the metrics rows' condition, and without one '?'
    folder = make_run(tmp_path / "bare" / "seed=1", seed=1, algorithm="maxrl", transform="gtpo",
                      condition_choice="grpo", steps_done=3, write_config=False)
    run = load_run(folder)
    assert (run.condition, run.seed, run.config) == ("maxrl+gtpo", 1, {})
    (folder / "metrics.jsonl").write_text('{"step": 0, "mean_reward": 0.5}\n')
    assert load_run(folder).condition == "?"


def test_runs_of_one_condition_at_two_learning_rates_are_refused_naming_the_key(tmp_path, capsys):
    root = grid(tmp_path / "c", config=lambda algorithm, seed: {"trainer": {"lr": 0.0005}} if seed == 2 else None)
    err = refused("compare", root, capsys)
    a, b = root / "grpo_none" / "seed=0", root / "grpo_none" / "seed=2"
    assert f"runs of grpo+none differ in trainer.lr (0.001 in {a}, 0.0005 in {b})" in err
    assert "runs of maxrl+none differ in trainer.lr" in err
    assert err.rstrip().endswith("compare runs of one setting, or pass --ignore-key trainer.lr")
    assert err.startswith("rlvr compare: error: ")
    # the user says it does not matter: compared, and the output says what was ignored
    assert main(["compare", str(root), "--ignore-key", "trainer.lr"]) == 0
    assert "config differences ignored (--ignore-key): trainer.lr" in capsys.readouterr().out
    assert main(["compare", str(root), "--ignore-key", "trainer", "--json"]) == 0  # a group: every key under it
    assert json.loads(capsys.readouterr().out)["ignored_keys"] == ["trainer"]


def test_conditions_at_different_learning_rates_are_not_a_comparison_of_algorithms(tmp_path, capsys):
    root = grid(tmp_path / "c", config=lambda algorithm, seed: {"trainer": {"lr": 0.0005}} if algorithm == "maxrl"
                else None)
    err = refused("compare", root, capsys, "--metric", "mean_reward")
    assert ("runs of grpo+none and maxrl+none differ outside algorithm, transform, turn_credit, "
            "trainer.dynamic_sampling, trainer.max_sample_batches, trainer.overlong, trainer.off_policy_steps, "
            "trainer.off_policy_mode, trainer.partial_rollouts, distill, in trainer.lr "
            f"(0.001 in grpo+none, e.g. {root / 'grpo_none' / 'seed=0'}; "
            f"0.0005 in maxrl+none, e.g. {root / 'maxrl_none' / 'seed=0'})") in err
    assert "--ignore-key trainer.lr" in err


def test_recipes_that_differ_in_the_trainer_keys_a_condition_sets_are_compared(tmp_path, capsys):
    # condition=dapo sets trainer.dynamic_sampling and trainer.overlong: part of its label, so a comparison
    dapo = {"trainer": {"dynamic_sampling": "refill", "max_sample_batches": 10,
                        "overlong": {"_target_": "rlvr.reward.overlong.Overlong", "buffer_frac": 0.2}}}
    root = grid(tmp_path / "c", config=lambda algorithm, seed: dapo if algorithm == "maxrl" else None)
    assert main(["compare", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {c["condition"] for c in out["conditions"]} == {"grpo+none", "maxrl+none,ds=refill,overlong=0.2"}


def test_a_key_present_in_some_configs_only_is_a_difference(tmp_path, capsys):
    root = grid(tmp_path / "c", conditions=(("grpo", "none"),),
                config=lambda algorithm, seed: {"reward": {"max_failed_steps": 5}} if seed else None)
    err = refused("compare", root, capsys)
    assert f"reward.max_failed_steps (absent in {root / 'grpo_none' / 'seed=0'}, 5 in" in err


def test_the_seed_and_bookkeeping_keys_may_differ(tmp_path, capsys):
    def bookkeeping(algorithm, seed):
        return {"threads": seed + 1, "trainer": {"max_steps": 10 + seed, "eval_every": 5 + seed, "save_every": seed},
                "logger": {"_target_": "rlvr.logger.trackers.Trackers",
                           "trackers": {"wandb": "rlvr.logger.wandb.WandbLogger"} if seed else {}},
                "resume": "never" if seed else "auto", "resume_allow_changes": ["trainer.lr"] if seed else []}

    root = grid(tmp_path / "c", config=bookkeeping)
    assert main(["compare", str(root)]) == 0
    assert main(["plot", str(root), "--out", str(tmp_path / "f.png")]) == 0


def test_what_makes_a_condition_may_differ_between_conditions(tmp_path, capsys):
    # sepa's own knobs, a loss mode, and another backend (tinker samples elsewhere: its own condition)
    root = grid(tmp_path / "c", conditions=(("grpo", "none"), ("maxrl", "sepa")),
                config=lambda algorithm, seed: {"transform": {"steps": 100}} if algorithm == "maxrl" else None)
    for seed in (0, 1, 2):
        make_run(root / "tinker" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=10, evals={0: 0.1, 10: 0.5},
                 config={"backend": {"_target_": "rlvr.backend.tinker.TinkerBackend", "base_url": "x"},
                         "algorithm": {"loss": {"mode": "kl_cov"}}})
    assert main(["compare", str(root), "--json"]) == 0
    conditions = [r["condition"] for r in json.loads(capsys.readouterr().out)["conditions"]]
    assert conditions == ["grpo+none", "grpo+none,loss=kl_cov,backend=tinker", "maxrl+sepa"]


def test_a_repeated_run_with_the_same_config_uses_the_newest_with_a_warning(tmp_path, capsys):
    root = grid(tmp_path / "c")
    make_run(root / "again" / "seed=0", seed=0, algorithm="grpo", transform="none", condition_choice=None,
             steps_done=10, evals={0: 0.1, 10: 0.9})
    assert main(["compare", str(root), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"grpo+none seed=0 has 2 runs; using the newest, {root / 'again' / 'seed=0'}" in captured.err
    grpo = json.loads(captured.out)["conditions"][0]
    assert grpo["condition"] == "grpo+none" and grpo["values"][0] == pytest.approx(0.9)


def test_two_runs_of_one_cell_with_different_configs_are_refused(tmp_path, capsys):
    root = grid(tmp_path / "c")
    make_run(root / "again" / "seed=0", seed=0, algorithm="grpo", transform="none", condition_choice=None,
             steps_done=10, evals={0: 0.1, 10: 0.9}, config={"trainer": {"group_size": 16}})
    err = refused("compare", root, capsys)
    assert (f"runs of grpo+none differ in trainer.group_size (16 in {root / 'again' / 'seed=0'}, "
            f"absent in {root / 'grpo_none' / 'seed=0'})") in err


def test_runs_without_a_readable_config_are_not_checked(tmp_path, capsys):
    root = grid(tmp_path / "c")
    make_run(root / "old" / "seed=3", seed=3, algorithm="grpo", transform="none", condition_choice=None,
             steps_done=10, evals={0: 0.1, 10: 0.5}, write_config=False)
    (root / "old" / "seed=3" / ".hydra" / "config.yaml").write_text("{unclosed: [")
    assert main(["compare", str(root)]) == 0
    captured = capsys.readouterr()
    assert "grpo+none" in captured.out and captured.err == ""


def test_runs_that_do_not_log_the_metric_are_not_in_the_comparison(tmp_path, capsys):
    root = grid(tmp_path / "c")
    pending = root / "pending" / "seed=0"
    make_run(pending, seed=0, algorithm="grpo", transform="none", condition_choice=None, steps_done=0,
             config={"trainer": {"lr": 0.1}})
    (pending / "metrics.jsonl").write_text("")
    assert main(["compare", str(root)]) == 0


def test_plot_refuses_the_same_runs_with_the_same_message(tmp_path, capsys):
    root = grid(tmp_path / "c", config=lambda algorithm, seed: {"trainer": {"lr": 0.0005}} if seed == 2 else None)
    compare_err = refused("compare", root, capsys).removeprefix("rlvr compare: error: ")
    plot_err = refused("plot", root, capsys, "--metric", "eval/accuracy").removeprefix("rlvr plot: error: ")
    assert plot_err == compare_err and not list(root.glob("*.png"))
    assert main(["plot", str(root), "--metric", "eval/accuracy", "--ignore-key", "trainer.lr"]) == 0
    assert (root / "plot_eval_accuracy.png").is_file()


def test_many_differing_keys_are_cut_short(tmp_path, capsys):
    model = {f"k{i}": i for i in range(10)}
    root = grid(tmp_path / "c", conditions=(("grpo", "none"),),
                config=lambda algorithm, seed: {"model": model} if seed == 1 else None)
    err = refused("compare", root, capsys)
    assert "and 4 more keys" in err and err.count("--ignore-key") == 6 and err.rstrip().endswith("…")
