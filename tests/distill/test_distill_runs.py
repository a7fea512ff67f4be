"""Distillation in real runs on the tiny model: a local teacher loaded from a run folder or its export, the
student's own start as a teacher (its credit is then 0 at the first step), a tokenizer that differs refused at start
(or mapped), and the self-teacher (transform=sdpo|sdft) shown an empty context (its credit is then 0 at every
step). docs/algorithms.md#on-policy-distillation, #self-distillation."""

import json
import subprocess
import sys

import pytest
import torch

from composing import FAST, MIXED, compose_config
from rlvr.distill.local import LocalTeacher
from rlvr.errors import ConfigError
from rlvr.run import run
from rlvr.telemetry import console_line

SHORT = FAST + ["trainer.evaluate=false"]
TINY_TEMPLATES = ["transform.template='{context}{prompt}'", "transform.context_template='{prompt}{solution}'"]


def rows(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A run of 0 steps: its checkpoint is the policy every FAST run at seed 0 starts from (its LoRA adapter is 0)."""
    folder = tmp_path_factory.mktemp("start")
    run(compose_config(SHORT + ["trainer.max_steps=0"]), folder)
    return folder


def test_the_students_own_start_as_teacher_gives_no_credit_at_first(start, tmp_path):
    run(compose_config(SHORT + ["algorithm=opd", "distill=teacher", f"distill.teacher.path={start}",
                                "trainer.max_steps=2"]), tmp_path)
    steps = rows(tmp_path)
    assert {r["condition"] for r in steps} == {"opd+none"}
    # step 0 samples from the teacher's own weights: log π_teacher − log π_sampler is float noise on every token
    assert steps[0]["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-5)
    assert all(r["distill/coef"] == 1.0 and r["distill/teacher_seconds"] > 0 for r in steps)


def test_the_full_estimator_trains_on_the_teachers_kl_alone_and_its_step_replays(start, tmp_path, capsys):
    from rlvr.cli.main import main

    run(compose_config(SHORT + ["algorithm=opd", "distill=teacher", f"distill.teacher.path={start}",
                                "distill.estimator=full", "distill.beta=0.5", "distill.tail=true",
                                "trainer.max_steps=2", "trainer.capture_steps=[1]"]),
        tmp_path)
    steps = rows(tmp_path)
    assert steps[0]["condition"].endswith(",distill=full/beta0.5/tail")
    # step 0: the student is its teacher, so the divergence over the whole vocabulary is float noise, yet every step
    # trains (no advantage anywhere: the teacher's Jensen-Shannon term is the whole loss); the captured step holds β
    # and the tail bucket, so it replays bit for bit
    assert steps[0]["distill/support_kl"] == pytest.approx(0.0, abs=1e-5)
    assert steps[0]["distill/loss"] == pytest.approx(0.0, abs=1e-5)
    assert all(not r["skipped"] and r["loss"] == 0.0 and r["distill/loss"] > -1e-6 for r in steps)
    kl = steps[1]["distill/support_kl"]
    assert console_line(steps[1], "2/2 steps").endswith(f"| loss +0.0000 | teacher KL {kl:.4f}")
    assert main(["replay", str(tmp_path / "captures" / "step_1")]) == 0, capsys.readouterr().out
    assert "IDENTICAL" in capsys.readouterr().out


def test_a_teacher_scores_alike_from_its_run_folder_its_export_and_by_hand(start, tmp_path):
    out = tmp_path / "export"
    subprocess.run([sys.executable, "-m", "rlvr.cli.main", "export", str(start), "--out", str(out)], check=True,
                   capture_output=True)
    from_run, from_export = LocalTeacher(path=str(start), batch_rows=2), LocalTeacher(path=str(out))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    completions = torch.tensor([[3, 4, 0, 0], [5, 6, 7, 0], [1, 2, 3, 4]])
    lengths = [2, 3, 4]
    a, b = from_run.score(prompts, completions, lengths, topk=3), from_export.score(prompts, completions, lengths, 3)
    assert torch.allclose(a.logprobs_N_T, b.logprobs_N_T, atol=1e-6)
    assert torch.equal(a.topk_ids_N_T_K, b.topk_ids_N_T_K)
    model = from_export.model
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):  # each row alone, unpadded
        ids = torch.tensor([prompt + completions[i, :n].tolist()])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        at = torch.arange(len(prompt) - 1, len(prompt) - 1 + n)
        assert torch.allclose(a.logprobs_N_T[i, :n], logp[at].gather(-1, completions[i, :n, None]).squeeze(-1),
                              atol=1e-5)
        assert torch.equal(a.topk_ids_N_T_K[i, :n], logp[at].topk(3, -1).indices)
        assert (a.logprobs_N_T[i, n:] == 0).all()


def test_a_teacher_with_another_tokenizer_is_refused_at_start_unless_mapped(tmp_path):
    teacher = tmp_path / "teacher"
    run(compose_config(SHORT + ["trainer.max_steps=0", "model.alphabet='0123456789=+'"]), teacher)
    opd = SHORT + ["algorithm=opd", "distill=teacher", f"distill.teacher.path={teacher}", "trainer.max_steps=1"]
    with pytest.raises(ConfigError, match=r"does not tokenize as the student does: the student's token '\+' is id "
                                          r"13, the teacher's 14.*distill.token_map"):
        run(compose_config(opd), tmp_path / "refused")
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()
    student = list(range(15))
    student[13], student[14] = 14, 13  # '+' and '=' swap places; every other id is the same token
    (tmp_path / "map.json").write_text(json.dumps({str(i): t for i, t in enumerate(student)}))
    run(compose_config(opd + [f"distill.token_map={tmp_path / 'map.json'}"]), tmp_path / "mapped")
    assert rows(tmp_path / "mapped")[0]["distill/reverse_kl"] != 0


def test_the_self_teacher_shown_nothing_more_scores_as_the_sampler(tmp_path):
    run(compose_config(SHORT + MIXED + ["transform=sdpo", "transform.teacher=live",
                                        "transform.template='{context}{prompt}'", "transform.context_template=''",
                                        "trainer.max_steps=3"]), tmp_path)
    steps = rows(tmp_path)
    assert {r["condition"] for r in steps} == {"grpo+sdpo"}
    assert any(r["self_distill/context_frac"] > 0 for r in steps)  # rows with a successful sibling
    for r in steps:  # the live policy, shown its own prompt: q_t − s_t is float noise
        assert r["self_distill/reverse_kl"] == pytest.approx(0.0, abs=1e-5)


def test_sdpo_full_puts_the_self_teachers_divergence_in_the_loss_and_its_step_replays(tmp_path, capsys):
    """condition=sdpo_full (SDPO's code defaults: Jensen-Shannon over the top-100, the tail bucket), the live policy
    as teacher, shown an empty context: the self-teacher is the student, so its divergence is float noise, yet the
    rows with context train on it alone (w = 1: no RL credit) and a captured step replays bit for bit."""
    from rlvr.cli.main import main

    run(compose_config(SHORT + MIXED + ["condition=sdpo_full", "transform.teacher=live",
                                        "transform.context_template=''", "trainer.max_steps=3",
                                        "trainer.capture_steps=[1]"]), tmp_path)
    steps = rows(tmp_path)
    assert {r["condition"] for r in steps} == {"grpo+sdpo,sd=full/top100/beta0.5/tail"}
    taught = [r for r in steps if r["self_distill/context_frac"] > 0]
    assert taught and steps[1] in taught
    for r in taught:
        assert not r["skipped"] and r["loss"] == 0.0  # no RL credit: the divergence is the whole loss
        assert r["distill/support_kl"] == pytest.approx(0.0, abs=1e-5)
        assert r["distill/loss"] == pytest.approx(0.0, abs=1e-5)
        assert r["self_distill/reverse_kl"] == pytest.approx(0.0, abs=1e-5)
    assert main(["replay", str(tmp_path / "captures" / "step_1")]) == 0, capsys.readouterr().out
    assert "IDENTICAL" in capsys.readouterr().out


def test_sdft_full_scores_under_the_reference_answer_with_the_adapter_off(tmp_path):
    """transform=sdft (teacher=base: the adapter disabled) with transform.estimator=full over the whole vocabulary:
    every row is shown its answer, so the self-teacher differs from the student and its KL is the loss's term."""
    run(compose_config(SHORT + ["transform=sdft", *TINY_TEMPLATES, "transform.estimator=full",
                                "trainer.max_steps=2"]), tmp_path)
    steps = rows(tmp_path)
    assert {r["condition"] for r in steps} == {"grpo+sdft,sd=full"}
    assert all(r["self_distill/context_frac"] == 1.0 for r in steps)
    assert all(r["distill/support_kl"] > 1e-3 and r["distill/loss"] == pytest.approx(r["distill/support_kl"],
                                                                                     rel=1e-5) for r in steps)


def test_the_ema_teacher_starts_as_the_policy_then_lags_it(tmp_path):
    """transform=sdpo's default teacher, the EMA of the weights (rate 0.05), shown nothing more than the student: at
    step 0 it is the policy (its KL float noise); once the policy has moved, the teacher trails it; the checkpoint
    holds it."""
    run(compose_config(SHORT + MIXED + ["transform=sdpo", "transform.template='{context}{prompt}'",
                                        "transform.context_template=''", "trainer.max_steps=4",
                                        "trainer.save_every=2"]), tmp_path)
    steps = rows(tmp_path)
    taught = [r for r in steps if r["self_distill/context_frac"] > 0]
    assert taught[0]["step"] == 0 and taught[0]["self_distill/reverse_kl"] == pytest.approx(0.0, abs=1e-5)
    assert any(abs(r["self_distill/reverse_kl"]) > 1e-4 for r in taught[1:])
    assert (tmp_path / "checkpoints" / "step_2" / "self_teacher_ema.safetensors").is_file()


def test_sdft_scores_each_row_under_the_reference_answer(tmp_path):
    run(compose_config(SHORT + ["transform=sdft", *TINY_TEMPLATES, "trainer.max_steps=2"]), tmp_path)
    steps = rows(tmp_path)
    assert {r["condition"] for r in steps} == {"grpo+sdft"}
    assert all(r["self_distill/context_frac"] == 1.0 for r in steps)  # every row is shown its answer
    assert all(r["self_distill/reverse_kl"] != 0 for r in steps)


def test_a_template_the_tokenizer_cannot_spell_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"transform.template=.*renders text this tokenizer cannot spell"):
        run(compose_config(SHORT + ["transform=sdpo", "trainer.max_steps=1"]), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_teacher_that_is_not_on_this_machine_is_refused_before_anything_loads(tmp_path):
    missing = tmp_path / "no-teacher"
    with pytest.raises(ConfigError, match=rf"distill.teacher.path={missing}: no such folder, and not in the local "
                                          r"hub cache"):
        run(compose_config(SHORT + ["algorithm=opd", "distill=teacher", f"distill.teacher.path={missing}"]),
            tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
