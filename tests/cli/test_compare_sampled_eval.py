"""`rlvr compare` and `rlvr plot` read a sampled evaluation's eval/pass@k, eval/avg@k, eval/maj@k like any
evaluation metric: chosen with --metric, listed when an unknown one is asked for."""

import json

from rlvr.cli.main import main
from tests.cli.conftest import make_run

PASS4 = {("grpo", 0): 0.50, ("grpo", 1): 0.60, ("grpo", 2): 0.55, ("maxrl", 0): 0.70, ("maxrl", 1): 0.65,
         ("maxrl", 2): 0.80}


def sampled_campaign(root):
    """Two conditions × 3 seeds whose evaluation rows carry avg@4 and pass@4 (the final pass@4: PASS4)."""
    for (algorithm, seed), final in PASS4.items():
        folder = make_run(root / algorithm / f"seed={seed}", seed=seed, algorithm=algorithm, transform="none",
                          condition_choice=None, steps_done=4, evals={0: 0.1, 4: 0.3})
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            if "eval/accuracy" in row:
                row.update({"eval/avg@4": row["eval/accuracy"], "eval/pass@1": row["eval/accuracy"],
                            "eval/pass@4": final if row["step"] == 4 else 0.2, "eval/maj@4": 0.25})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_compare_reads_pass_at_k_from_the_evaluation_rows(tmp_path, capsys):
    root = sampled_campaign(tmp_path / "camp")
    assert main(["compare", str(root), "--metric", "eval/pass@4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    by = {r["condition"]: r for r in result["conditions"]}
    assert by["grpo+none"]["values"] == [0.50, 0.60, 0.55] and by["maxrl+none"]["values"] == [0.70, 0.65, 0.80]
    # paired by seed: (0.70 − 0.50, 0.65 − 0.60, 0.80 − 0.55) = (0.20, 0.05, 0.25), mean 0.5/3
    assert abs(by["maxrl+none"]["diff"]["mean"] - 0.5 / 3) < 1e-12


def test_an_unknown_metric_lists_the_sampled_ones(tmp_path, capsys):
    root = sampled_campaign(tmp_path / "camp")
    assert main(["compare", str(root), "--metric", "eval/pass@8"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'eval/pass@8'" in err and all(m in err for m in ("eval/pass@4", "eval/avg@4", "eval/maj@4"))
