"""The rollout: how a step's examples become scored rows, the one seam between what is sampled and what is
trained. The trainer (rlvr/trainer.py) never asks which kind it has:

    sampled = rollout.sample(examples, step, position, G, sampling)   this process's share (engine, environment)
    batch   = rollout.finish(sampled)                                  scored and gathered: a StepBatch (rlvr/types.py)
    eval    = rollout.evaluate(examples, max_tokens)                   the same, greedy, one row per example

`sample` uses only the engine (and an environment), so an overlapped run calls it in its sampler thread
(rlvr/overlap.py); `finish` runs in the trainer's thread (a verifier may need the main thread; a gather is a
collective).

    single_turn.py  SingleTurn: data → engine → reward; a row is one completion of its prompt
    episodes.py     Episodes: env → turns → the played batch; a row is one episode, played by episode_loop.py
                    (reset, turns, probes; playing.py one episode's state, pack.py the rows), branch_probes.py
                    forks them for turn_credit=tl_grpo; rlvr/chat/ renders observations under a chat template
    evaluate.py     the held-out evaluation, one function over either, streamed in parts of trainer.eval_rows rows

Each rollout's `Sampled` carries its own rows: `Completions` (single turn) or `PlayedShare` (episodes). Turn credit
is not the rollout's: the credit step reads the played batch (rlvr/credit.py).

Both shard a step over the processes of a run (`World`, rlvr/distributed.py): each collects its contiguous
share of whole groups, each group from its own seeds, and the batch is gathered, so every process holds the
whole step. One process is a world of size 1, where sharing and gathering are the identity.
"""

from rlvr.rollout.episodes import Episodes
from rlvr.rollout.evaluate import EVAL_ROWS, Part, evaluate
from rlvr.rollout.single_turn import SingleTurn

__all__ = ["EVAL_ROWS", "Episodes", "Part", "SingleTurn", "evaluate"]
