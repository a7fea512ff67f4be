"""Distillation as token credit (docs/algorithms.md#distillation): a teacher scores the tokens the student sampled,
and the per-token log-ratio log π_teacher − log π_student becomes credit.

    teacher.py       the Teacher protocol and what it returns (TeacherScores)
    local.py         a frozen local checkpoint (an rlvr run's folder or export, any transformers model)
    server.py        an OpenAI-compatible server that returns prompt log-probabilities (vLLM's `prompt_logprobs`)
    credit.py        the per-token terms (sampled token; top-k) and how they join the RL credit
"""
