"""Random steps for the property tests: a few groups of ragged completions, as lists and as TokenSignals.

Log-probabilities are multiples of −0.001 in [−60, 0] (so surprisal clipping at 50 is exercised and no
mean sits within rounding of GTPO's 1e-7 guard by accident); advantages are multiples of 0.01, and a
group is all-zero (tied) with probability ≈ 1/3. `turn_adv` turns them into [P·G, T] token advantages of mixed
signs, as a multi-turn turn credit gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from rlvr.transform.sepa_controller import LambdaSchedule
from rlvr.types import TokenSignals
from tests.transform.retrain_reference import mask_of, pad

TURN_FACTORS = (1.0, 1.0, -0.5, 0.0, 1.5)
SCHEDULE = dict(kind="linear", steps=500, delay_steps=50, correct_rate_gate=0.1, ema_decay=0.99, var_threshold=0.2,
                warmup_sequences=50, fixed_lambda=None)
"""conf/lambda_schedule.yaml's defaults, transform.schedule (test_transform_configs.py checks that they agree)."""


def schedule(**knobs) -> LambdaSchedule:
    """transform.schedule as Hydra builds it for transform=sepa*, delight_sepa, hard_delight: SCHEDULE, `knobs`
    replacing some of it."""
    return LambdaSchedule(**{**SCHEDULE, **knobs})


@dataclass(frozen=True)
class StepCase:
    group_size: int
    length: int
    adv_PG: list[float]
    logprobs_PG: list[list[float]]
    entropies_PG: list[list[float]]
    planning_PG: list[list[int]]

    def signals(
        self,
        dtype: torch.dtype = torch.float64,
        *,
        step: int = 0,
        correct_rate: float = 0.0,
        garbage_padding: bool = False,
    ) -> TokenSignals:
        """Padded tensors; `garbage_padding` fills padding with NaN/−inf/True to prove it never leaks."""
        nan = float("nan")
        lp = pad(self.logprobs_PG, self.length, dtype, nan if garbage_padding else 0.0)
        ent = pad(self.entropies_PG, self.length, dtype, nan if garbage_padding else 0.0)
        plan_rows = [[float(m) for m in row] for row in self.planning_PG]
        plan = pad(plan_rows, self.length, dtype, 1.0 if garbage_padding else 0.0)
        if garbage_padding:  # the last position's padding holds −inf instead of NaN
            lp[:, -1] = torch.where(mask_of(self.logprobs_PG, self.length)[:, -1], lp[:, -1], -torch.inf)
        return TokenSignals(
            logprobs_PG_T=lp,
            mask_PG_T=mask_of(self.logprobs_PG, self.length),
            group_size=self.group_size,
            step=step,
            correct_rate=correct_rate,
            entropy_PG_T=ent,
            planning_PG_T=plan.bool(),
        )

    def adv(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return torch.tensor(self.adv_PG, dtype=dtype)

    def turn_adv(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """[P·G, T] token advantages as a multi-turn turn credit gives them: each completion's A times a repeating
        per-token pattern (TURN_FACTORS: some tokens flip sign, some get 0), 0 at padding."""
        factors_T = torch.tensor([TURN_FACTORS[t % len(TURN_FACTORS)] for t in range(self.length)], dtype=dtype)
        return self.adv(dtype)[:, None] * factors_T * mask_of(self.logprobs_PG, self.length)


@st.composite
def step_cases(draw: st.DrawFn, max_groups: int = 3, max_group_size: int = 4, max_len: int = 8) -> StepCase:
    num_groups = draw(st.integers(1, max_groups))
    group_size = draw(st.integers(1, max_group_size))
    length = draw(st.integers(1, max_len))
    rows = num_groups * group_size
    lengths = draw(st.lists(st.integers(0, length), min_size=rows, max_size=rows))
    milli = st.integers(0, 60_000).map(lambda k: k / 1000)
    logprobs = [[-x for x in draw(st.lists(milli, min_size=n, max_size=n))] for n in lengths]
    entropies = [draw(st.lists(milli, min_size=n, max_size=n)) for n in lengths]
    planning = [draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)) for n in lengths]
    adv: list[float] = []
    for _ in range(num_groups):
        if draw(st.integers(0, 2)) == 0:
            adv += [0.0] * group_size
        else:
            centi = st.integers(-2000, 2000).map(lambda k: k / 100)
            adv += draw(st.lists(centi, min_size=group_size, max_size=group_size))
    return StepCase(group_size, length, adv, logprobs, entropies, planning)
