"""The distillation credit's arithmetic (docs/algorithms.md#on-policy-distillation, #self-distillation), by hand."""

import math

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
    settings = {"context": "feedback", "teacher": "teacher", "weight": 0.0, "success_threshold": 0.5,
                "template": "{prompt}", "context_template": "{answer}", "ema_rate": 0.0}
    errors = SelfDistill.needs(settings).errors
    assert any(e.startswith("transform.context='feedback'") for e in errors)
    assert any(e.startswith("transform.teacher='teacher'") for e in errors)
    assert any(e.startswith("transform.ema_rate=0.0: expected 0 < rate <= 1") for e in errors)
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
    assert distill_label({"algorithm": opd, "distill": {"coef": 1.0, "estimator": "full"}}) == ",distill=full"
    assert distill_label({"algorithm": grpo, "distill": {"coef": 0.5, "estimator": "full"}}) == ",distill=0.5/full"


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


def test_the_full_estimator_is_the_reverse_kl_over_the_teachers_renormalised_topk():
    """Student p = (0.5, 0.3, 0.2), teacher q = (0.6, 0.1, 0.3) over a 3-token vocabulary.
    Top-2 of the teacher, S = {0, 2}: p̃ = (5/7, 2/7), q̃ = (2/3, 1/3),
        KL = 5/7·ln((5/7)/(2/3)) + 2/7·ln((2/7)/(1/3)) = 5/7·ln(15/14) + 2/7·ln(6/7) = 0.049281 − 0.044043 = 0.005238.
    The whole vocabulary: KL = 0.5·ln(5/6) + 0.3·ln 3 + 0.2·ln(2/3) = −0.091161 + 0.329584 − 0.081093 = 0.157330,
    and its gradient in the student's logits z is p ⊙ (log p − log q − KL)."""
    from rlvr.loss.contract import LossInputs
    from rlvr.loss.regularizers import distill_kl

    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.6, 0.1, 0.3])
    z = p.log().clone().requires_grad_(True)

    def inputs(ids: list[int], weight: float) -> LossInputs:
        student = torch.log_softmax(z, -1)[ids][None, None]  # [N=1, T=1, K]
        one = torch.ones(1, 1)
        return LossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), one.bool() & False, 1,
                          one.bool(), distill_weights=weight * one, student_support_logprobs=student,
                          teacher_support_logprobs=q.log()[ids][None, None])

    top2 = distill_kl(inputs([0, 2], 1.0), None).loss  # type: ignore[arg-type]
    assert float(top2) == pytest.approx(5 / 7 * math.log(15 / 14) + 2 / 7 * math.log(6 / 7), abs=1e-6)
    assert float(top2) == pytest.approx(0.005238, abs=1e-6)
    out = PolicyLoss(0.0, 0.0, 0.0)(inputs([0, 1, 2], 0.25))  # no policy token: the loss is 0.25 × KL alone
    kl = 0.5 * math.log(5 / 6) + 0.3 * math.log(3) + 0.2 * math.log(2 / 3)
    assert float(out.loss) == pytest.approx(0.25 * kl, abs=1e-6) and kl == pytest.approx(0.157330, abs=1e-6)
    assert float(out.metrics["distill_kl"]) == pytest.approx(kl, abs=1e-6)
    out.loss.backward()
    torch.testing.assert_close(z.grad, 0.25 * p * (p.log() - q.log() - kl), rtol=0, atol=1e-6)


def test_beta_chooses_the_divergence_and_tail_keeps_the_mass_outside_the_topk():
    """The same p = (0.5, 0.3, 0.2), q = (0.6, 0.1, 0.3), the whole vocabulary (TRL's and SDPO's β):
    β = 0, the forward KL(q ‖ p) = 0.6·ln(6/5) + 0.1·ln(1/3) + 0.3·ln(3/2) = 0.109393 − 0.109861 + 0.121640
          = 0.121172, whose gradient in the student's logits z is p − q;
    β = ½, M = (p + q)/2 = (0.55, 0.2, 0.25): KL(q ‖ M) = 0.6·ln(12/11) + 0.1·ln(1/2) + 0.3·ln(6/5) = 0.037589,
          KL(p ‖ M) = 0.5·ln(10/11) + 0.3·ln(3/2) + 0.2·ln(4/5) = 0.029356, JSD = ½·0.037589 + ½·0.029356 = 0.033472;
    β = ¼, M = ¼q + ¾p = (0.525, 0.25, 0.225): ¼·KL(q ‖ M) + ¾·KL(p ‖ M) = 0.023757.
    With the tail bucket, the teacher's top-2 S = {0, 2} and the rest as a third outcome: p → (0.5, 0.2 | 0.3),
    q → (0.6, 0.3 | 0.1), and the reverse KL over the three is the whole vocabulary's 0.157330 (its rest is token 1),
    where renormalising over S gave 0.005238. `distill/support_kl` stays the reverse KL whatever β."""
    from rlvr.loss.contract import LossInputs
    from rlvr.loss.regularizers import distill_kl

    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.6, 0.1, 0.3])
    z = p.log().clone().requires_grad_(True)
    reverse = 0.157330

    def term(ids: list[int], beta: float = 1.0, tail: bool = False):
        one = torch.ones(1, 1)
        return distill_kl(LossInputs(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), one.bool() & False, 1, one.bool(),
            distill_weights=one, student_support_logprobs=torch.log_softmax(z, -1)[ids][None, None],
            teacher_support_logprobs=q.log()[ids][None, None], distill_beta=beta, distill_tail=tail),
            None)  # type: ignore[arg-type]

    forward = term([0, 1, 2], beta=0.0)
    assert float(forward.loss) == pytest.approx(0.121172, abs=1e-6)
    assert float(forward.metrics["reverse_kl"]) == pytest.approx(reverse, abs=1e-6)
    forward.loss.sum().backward()
    torch.testing.assert_close(z.grad, p - q, rtol=0, atol=1e-6)
    assert float(term([0, 1, 2], beta=0.5).loss) == pytest.approx(0.5 * 0.037589 + 0.5 * 0.029356, abs=1e-6)
    assert float(term([0, 1, 2], beta=0.5).loss) == pytest.approx(0.033472, abs=1e-6)
    assert float(term([0, 1, 2], beta=0.25).loss) == pytest.approx(0.023757, abs=1e-6)
    assert float(term([0, 2], tail=True).loss) == pytest.approx(reverse, abs=1e-6)
    assert float(term([0, 2]).loss) == pytest.approx(0.005238, abs=1e-6)
    whole = term([0, 1, 2], tail=True)  # nothing outside the vocabulary: the bucket is empty on both sides
    assert float(whole.loss) == pytest.approx(reverse, abs=1e-5) and torch.isfinite(whole.loss).all()


def test_beta_and_tail_belong_to_the_full_estimator_and_show_in_the_label():
    from rlvr.distill.distill import Distill

    local = {"_target_": "rlvr.distill.local.LocalTeacher", "path": "/nowhere"}
    full = {"coef": 1.0, "topk": 0, "estimator": "full", "teacher": local}
    assert Distill.needs({**full, "beta": 0.5, "tail": True}).errors == ()
    for bad in (-0.1, 1.5, "half", None):
        assert any(e.startswith(f"distill.beta={bad}") for e in Distill.needs({**full, "beta": bad}).errors)
    assert any(e.startswith("distill.tail=") for e in Distill.needs({**full, "tail": "yes"}).errors)
    sampled = {**full, "estimator": "sampled"}
    assert any("distill.beta=0.5 chooses the divergence of distill.estimator=full" in e
               for e in Distill.needs({**sampled, "beta": 0.5}).errors)
    assert any("distill.tail=true" in e for e in Distill.needs({**sampled, "tail": True}).errors)
    opd = {"algorithm": {"_target_": "rlvr.algorithm.opd.OPD"}}
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "full"}}) == ",distill=full"
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "full", "beta": 1.0, "tail": False}}
                         ) == ",distill=full"
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "full", "beta": 0.5, "tail": True}}
                         ) == ",distill=full/beta0.5/tail"
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "full", "beta": 0.0}}) == ",distill=full/beta0"
    # the teacher's top-k is part of the objective under either estimator: a grid over it alone gets two labels
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "full", "topk": 20, "beta": 0.5}}
                         ) == ",distill=full/top20/beta0.5"
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "sampled", "topk": 5}}) == ",distill=top5"
    assert distill_label({"distill": {"coef": 0.5, "topk": 5}}) == ",distill=0.5/top5"
    assert distill_label({**opd, "distill": {"coef": 1.0, "estimator": "sampled", "topk": 0}}) == ""


def test_self_distillation_full_leaves_the_rl_credit_and_weighs_the_rows_with_context():
    """transform.estimator=full: A_t = (1 − w)·A on action tokens, the self-teacher's support weighing w / (the action
    tokens of rows with context). Rows 0 and 2 have context (3 + 1 action tokens), w = 0.25: weights 0.0625."""
    sd = SelfDistill(context="sibling", teacher="live", weight=0.25, success_threshold=0.5, estimator="full",
                     topk=0, beta=0.5, tail=True, **TINY)
    mask = [[True, True, True], [True, False, False], [True, False, False], [False, False, False]]
    sig = signals([[-1.0] * 3] * 4, mask, self_teacher_PG_T=torch.tensor([[-0.5] * 3] * 4))
    adv, fields = sd(torch.tensor([0.5, -0.5, 0.5, -0.5]), sig)
    torch.testing.assert_close(adv, 0.75 * torch.tensor([[0.5] * 3, [-0.5, 0, 0], [0.5, 0, 0], [0.0] * 3]))
    assert fields["self_distill/reverse_kl"] == pytest.approx(-0.5)  # the one-sample estimate, reported still
    top = (torch.zeros(4, 3, 2, dtype=torch.long), torch.zeros(4, 3, 2))
    support = sd.support(top, torch.tensor(mask), torch.tensor([True, False, True, False]))
    torch.testing.assert_close(support.weight_PG_T, torch.tensor(
        [[0.0625] * 3, [0.0, 0, 0], [0.0625, 0, 0], [0.0] * 3]))
    assert (support.beta, support.tail) == (0.5, True)


def test_self_distillation_full_needs_the_local_loss_and_one_support_a_step():
    base = {"context": "sibling", "teacher": "live", "weight": 1.0, "success_threshold": 0.5, **TINY}
    needs = SelfDistill.needs({**base, "estimator": "full", "topk": 100, "beta": 0.5, "tail": True})
    assert needs.errors == () and "local_loss" in needs.requires
    assert {"teacher_support", "masked_token_mean"} <= set(needs.excludes)
    sampled = SelfDistill.needs(base)
    assert "local_loss" not in sampled.requires and "teacher_support" not in sampled.excludes
    assert any(e.startswith("transform.beta=0.5 chooses the divergence of transform.estimator=full")
               for e in SelfDistill.needs({**base, "beta": 0.5}).errors)
    assert any(e.startswith("transform.topk=-1") for e in SelfDistill.needs({**base, "topk": -1}).errors)
    assert any(e.startswith("transform.topk=100 is the support of transform.estimator=full")
               for e in SelfDistill.needs({**base, "topk": 100}).errors)
    assert any(e.startswith("transform.ema_rate=0.1 moves the EMA teacher, which transform.teacher=live is not")
               for e in SelfDistill.needs({**base, "ema_rate": 0.1}).errors)
    assert SelfDistill.needs({**base, "teacher": "ema", "ema_rate": 0.1}).errors == ()
    assert any(e.startswith("transform.estimator='logits'")
               for e in SelfDistill.needs({**base, "estimator": "logits"}).errors)
    from rlvr.labels import self_distill_label

    assert self_distill_label({"transform": {**base, "estimator": "full", "beta": 0.5, "tail": True}}
                              ) == ",sd=full/beta0.5/tail"
    assert self_distill_label({"transform": {**base, "estimator": "full", "topk": 100, "beta": 0.5, "tail": True}}
                              ) == ",sd=full/top100/beta0.5/tail"
    assert self_distill_label({"transform": base}) == ""
    from rlvr.distill.distill import teacher_memory

    line, = teacher_memory({"transform": {**base, "estimator": "full", "topk": 100}}, self_scoring=True)
    assert "one more no-grad forward pass" in line and "its top-k (k = 100) ids and log-probabilities" in line
    line, = teacher_memory({"transform": base}, self_scoring=True)
    assert "top-k" not in line


def test_the_full_estimator_needs_the_local_loss_and_a_teacher_that_has_every_token():
    from rlvr.distill.distill import Distill

    local = {"_target_": "rlvr.distill.local.LocalTeacher", "path": "/nowhere"}
    server = {"_target_": "rlvr.distill.server.ServerTeacher", "model": "m", "base_url": "http://127.0.0.1:1/v1",
              "api_key_env": None}
    full = {"coef": 1.0, "topk": 0, "estimator": "full"}
    needs = Distill.needs({**full, "teacher": local})
    assert needs.errors == () and "local_loss" in needs.requires and "masked_token_mean" in needs.excludes
    assert any("only a local teacher" in e for e in Distill.needs({**full, "teacher": server}).errors)
    assert Distill.needs({**full, "topk": 20, "teacher": server}).errors == ()
    assert any(e.startswith("distill.estimator='exact'")
               for e in Distill.needs({**full, "estimator": "exact", "teacher": local}).errors)
    sampled = Distill.needs({**full, "estimator": "sampled", "teacher": local})
    assert "local_loss" not in sampled.requires and "masked_token_mean" not in sampled.excludes


def test_the_full_estimator_is_refused_where_the_trainer_does_not_compute_the_loss():
    from composing import FAST, compose_config
    from rlvr.config_check import config_problems

    full = FAST + ["algorithm=opd", "distill=teacher", "distill.teacher.path=/nowhere", "distill.estimator=full"]
    _, errors = config_problems(compose_config(full + ["backend=tinker", "engine=tinker"]), at_start=False)
    assert any("distill.estimator=full adds the teacher's KL to the loss" in e for e in errors), errors
    _, errors = config_problems(compose_config(full), at_start=False)
    assert not any("distill" in e for e in errors), errors


def test_the_whole_vocabulary_of_a_large_tokenizer_is_refused_before_the_teacher_loads():
    from rlvr.distill.distill import Distill

    class Never:
        def load(self, device):
            raise AssertionError("refused before loading")

    with pytest.raises(ConfigError, match=r"distill.estimator=full with distill.topk=0 .* 151936 ids"):
        Distill(teacher=Never(), estimator="full").open(list(range(151936)))  # type: ignore[arg-type]
