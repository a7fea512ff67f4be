"""The distillation credit's arithmetic (docs/algorithms.md#on-policy-distillation, #self-distillation), by hand."""

import pytest
import torch

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.opd import OPD
from rlvr.credit import assign_credit
from rlvr.distill.credit import log_ratio, reverse_kl
from rlvr.distill.self_teacher import SelfTeacher
from rlvr.errors import ConfigError
from rlvr.labels import distill_label
from rlvr.transform.none import NoTransform
from rlvr.transform.self_distill import SelfDistill
from rlvr.types import Example, TokenSignals

LOSS = PolicyLoss(clip_eps=0.2, clip_eps_high=0.2, adv_clip_max=0.0)
TINY = {"template": "{context}{prompt}", "context_template": "{prompt}{solution}"}


def signals(student, mask, **extra):
    return TokenSignals(logprobs_PG_T=torch.tensor(student), mask_PG_T=torch.tensor(mask), group_size=2, step=0,
                        correct_rate=0.5, **extra)


def test_the_log_ratio_is_teacher_minus_student_on_action_tokens_only():
    teacher = torch.tensor([[-0.5, -1.0, -9.0]])
    student = torch.tensor([[-1.0, -0.25, -3.0]])
    mask = torch.tensor([[True, True, False]])
    d = log_ratio(teacher, student, mask)
    assert d.tolist() == [[0.5, -0.75, 0.0]]  # −0.5 − (−1.0) = 0.5; −1.0 − (−0.25) = −0.75; padding exactly 0
    assert reverse_kl(d, mask) == pytest.approx(0.125)  # −(0.5 − 0.75) / 2 tokens


def test_a_teachers_credit_joins_grpo_after_the_transform():
    # rewards [1, 0]: GRPO's A = r − mean = [0.5, −0.5] on every token; the teacher adds coef·d_t
    d = torch.tensor([[0.2, 0.0], [-0.1, 0.3]])
    s = signals([[-1.0, -1.0], [-1.0, -1.0]], [[True, True], [True, True]], distill_PG_T=d)
    credit = assign_credit(torch.tensor([[1.0, 0.0]]), s, GRPO(LOSS), NoTransform())
    assert torch.allclose(credit.adv_PG_T, torch.tensor([[0.7, 0.5], [-0.6, -0.2]]))


def test_opd_trains_on_the_teachers_credit_alone():
    d = torch.tensor([[0.2, -0.4], [0.0, 0.0]])
    s = signals([[-1.0, -1.0], [-1.0, -1.0]], [[True, True], [True, True]], distill_PG_T=d)
    credit = assign_credit(torch.tensor([[1.0, 0.0]]), s, OPD(LOSS), NoTransform())
    assert credit.adv_P_G.tolist() == [[0.0, 0.0]]  # the rewards give no credit
    assert torch.allclose(credit.adv_PG_T, torch.tensor([[0.2, -0.4], [0.0, 0.0]]))
    assert not credit.skipped


def test_self_distillation_mixes_its_log_ratio_with_the_rl_credit():
    student = [[-1.0, -2.0], [-0.5, -0.5]]
    teacher = torch.tensor([[-0.5, -2.5], [-0.5, -0.5]])  # row 1 has no context: the teacher is the student there
    s = signals(student, [[True, True], [True, False]], self_teacher_PG_T=teacher)
    alone = SelfDistill(context="sibling", teacher="live", weight=1.0, success_threshold=0.5, **TINY)
    adv, metrics = alone(torch.tensor([0.5, -0.5]), s)
    assert adv.tolist() == [[0.5, -0.5], [0.0, 0.0]]  # S = q − s = [0.5, −0.5]; row 1 trains nothing
    assert metrics["self_distill/reverse_kl"] == pytest.approx(0.0)  # −(0.5 − 0.5) / 2 on the row with context
    mixed = SelfDistill(context="sibling", teacher="live", weight=0.25, success_threshold=0.5, **TINY)
    adv, _ = mixed(torch.tensor([0.5, -0.5]), s)
    # 0.75·A + 0.25·S: row 0: 0.375 + 0.125 = 0.5, 0.375 − 0.125 = 0.25; row 1: −0.375 and padding 0
    assert torch.allclose(adv, torch.tensor([[0.5, 0.25], [-0.375, 0.0]]))


def test_a_row_is_shown_the_first_other_success_of_its_group():
    teacher = SelfTeacher("sibling", "live", 0.5, "{context}{prompt}", "{prompt}{solution}")
    examples = [Example("1+1=", "2"), Example("2+2=", "4")]
    completions = ["2", "3", "2", "4", "5", "6"]
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]  # group 0: rows 0 and 2 succeed; group 1: only row 3
    assert teacher.contexts(examples, completions, rewards, 3) == [
        "1+1=21+1=",  # row 0: row 2 (itself never counts)
        "1+1=21+1=",  # row 1: row 0, the first success
        "1+1=21+1=",  # row 2: row 0
        None,         # row 3: the only success of its group
        "2+2=42+2=", "2+2=42+2=",
    ]
    reference = SelfTeacher("reference", "base", 0.5, "{context}{prompt}", "{prompt}{solution}")
    assert reference.contexts(examples, completions, rewards, 3)[4] == "2+2=42+2="  # the data's answer, every row


def test_bad_self_distillation_settings_name_their_key():
    settings = {"context": "feedback", "teacher": "ema", "weight": 0.0, "success_threshold": 0.5,
                "template": "{prompt}", "context_template": "{answer}"}
    errors = SelfDistill.needs(settings).errors
    assert any(e.startswith("transform.context='feedback'") for e in errors)
    assert any(e.startswith("transform.teacher='ema'") for e in errors)
    assert any(e.startswith("transform.weight=0.0") for e in errors)
    assert any("never shows {context}" in e for e in errors)
    assert any(e.startswith("transform.context_template='{answer}'") for e in errors)


def test_the_label_names_a_teachers_coefficient_beside_rl():
    opd = {"_target_": "rlvr.algorithm.opd.OPD"}
    grpo = {"_target_": "rlvr.algorithm.grpo.GRPO"}
    assert distill_label({"algorithm": opd, "distill": {"coef": 1.0}}) == ""
    assert distill_label({"algorithm": opd, "distill": {"coef": 2.0}}) == ",distill=2"
    assert distill_label({"algorithm": grpo, "distill": {"coef": 0.5}}) == ",distill=0.5"
    assert distill_label({"algorithm": grpo, "distill": None}) == ""


def test_a_token_map_must_cover_every_student_id(tmp_path):
    from rlvr.distill.distill import read_token_map

    (tmp_path / "map.json").write_text('{"0": 1, "1": 0}')
    assert read_token_map(tmp_path / "map.json", 2).tolist() == [1, 0]
    with pytest.raises(ConfigError, match=r"distill.token_map=.* maps no teacher id for 1 of the student's 3"):
        read_token_map(tmp_path / "map.json", 3)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"distill.token_map=.*expected a JSON object"):
        read_token_map(tmp_path / "bad.json", 2)


def test_the_topk_variant_reads_the_teachers_topk_and_its_tail():
    from rlvr.distill.credit import within_topk

    tokens = torch.tensor([[3, 7]])
    ids = torch.tensor([[[3, 5], [1, 2]]])  # position 0: y=3 is in the top-2; position 1: y=7 is not
    lp = torch.log(torch.tensor([[[0.5, 0.25], [0.5, 0.3]]]))
    q, found = within_topk(tokens, ids, lp)
    assert found.tolist() == [[True, False]]
    # position 0: log 0.5; position 1: the mass outside the top-2, log(1 − 0.5 − 0.3) = log 0.2
    assert torch.allclose(q, torch.log(torch.tensor([[0.5, 0.2]])))
