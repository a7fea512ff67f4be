"""The rollout: how a step's examples become scored rows, the one seam between what is sampled and what is
trained. The trainer (rlvr/trainer.py) never asks which kind it has:

    batch = rollout.collect(examples, step, position, G, sampling)     a StepBatch (rlvr/types.py)
    eval  = rollout.evaluate(examples, max_tokens)                     the same, greedy, one row per example

    single_turn.py  SingleTurn: data → engine → reward; a row is one completion of its prompt
    episodes.py     Episodes: env → turns → turn signals; a row is one episode (branch_probes.py forks them for
                    turn_credit=tl_grpo, chat_turns.py renders observations under a chat template)
    evaluate.py     the held-out evaluation, one function over either

Both shard a step over the processes of a run (`World`, rlvr/distributed.py): each collects its contiguous
share of whole groups, each group from its own seeds, and the batch is gathered, so every process holds the
whole step. One process is a world of size 1, where sharing and gathering are the identity.
"""

from rlvr.rollout.episodes import Episodes
from rlvr.rollout.evaluate import Evaluation, evaluate
from rlvr.rollout.single_turn import SingleTurn

__all__ = ["Episodes", "Evaluation", "SingleTurn", "evaluate"]
