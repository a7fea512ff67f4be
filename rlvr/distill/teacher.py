"""What a distillation teacher is asked and what it answers.

A teacher scores sequences it did not sample: for each row, the prompt's token ids and the student's completion
tokens, it returns log π_teacher(y_t | prompt, y_<t) of every completion token, and, asked for top-k, its k most
likely tokens at each completion position with their log-probabilities. Log-probabilities are of the teacher's
untempered distribution (temperature 1). Token ids are the student's: a teacher with another tokenizer is refused
at start unless `distill.token_map` maps the student's ids onto its own (rlvr/distill/token_map.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rlvr.types import TeacherScores

if TYPE_CHECKING:
    from torch import Tensor


class Teacher(Protocol):
    def load(self, device: Any = "cpu") -> None:
        """At start, once: whatever the teacher keeps in this process (a local one's weights, on `device`)."""
        ...

    def score(self, prompts: Sequence[Sequence[int]], completions_N_T: Tensor, lengths: Sequence[int], topk: int = 0
              ) -> TeacherScores:
        """Row i: the prompt `prompts[i]`, then `completions_N_T[i, :lengths[i]]` (int64 student token ids).
        `topk` = 0: only the sampled tokens' log-probabilities; k ≥ 1: the top-k as well."""
        ...

    def describe(self) -> str:
        """One line for logs and `rlvr plan`: what the teacher is and where it lives."""
        ...

    def vocabulary_check(self, student_tokenizer: Any) -> str | None:
        """None when the teacher gives every token the student's id; else the first difference, in words."""
        ...
