"""Does an `env=guess` policy use the feedback? Greedy games on the held-out game seeds, read turn by turn.

    .venv/bin/python -m bench.guess_feedback outputs/guess-arithmetic-tiny/grpo+none,turn=reward_to_go/<timestamp>
    .venv/bin/python -m bench.guess_feedback RUN data.eval_size=1000     # more held-out games

RUN is a run folder (its final checkpoint, else its latest) or a `checkpoints/step_N` folder; overrides are
`rlvr eval`'s (rlvr/cli/from_checkpoint.py). The policy is rebuilt by the repository's own loaders
(`open_checkpoint`), and the games are the trainer's evaluation games: one greedy episode per held-out example
(`data.eval_size` of them) on `eval_episode_seeds`, `trainer.eval_max_tokens` per turn, so the success rate
equals the run's `eval/accuracy` at that step. Beside it, the warm-up's policy: `<run>/base/` without the
checkpoint's weights (the model RL started from; LoRA's initial adapter is the identity).

Printed per policy, over the games whose first guess g1 was wrong and that got a second guess g2:

    success                  solved games / games
    P(g2 > g1 | higher)      after the feedback "the secret is higher"
    P(g2 < g1 | lower)       after "lower"
    g2 - g1 | higher, lower  the distribution of the step, as counts of each difference

A policy that ignores the feedback answers the same g2 after either feedback (greedy: the same context but one
token), so at most one of the two rates can be high; bisection has both at 1. A second guess that is not a
number in range (an invalid action ends the game) counts as neither.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FeedbackCounts:
    """Greedy games read turn by turn (see the module docstring)."""

    games: int = 0
    solved: int = 0
    after: dict[str, Counter] = field(default_factory=lambda: {"higher": Counter(), "lower": Counter()})
    """Per feedback after the first guess: counts of g2 − g1 (None: the second action was not a number)."""

    def add(self, transcript: list[dict], solved: bool, higher: str, lower: str) -> None:
        """One game: [{"role": "env", "text": prompt}, {"role": "policy", "text": g1}, {"role": "env",
        "text": feedback}, {"role": "policy", "text": g2}, …], as rlvr/rollout/episodes.py writes it."""
        self.games += 1
        self.solved += bool(solved)
        turns = transcript[1:]
        if len(turns) < 3 or turns[1]["role"] != "env" or turns[1]["text"] not in (higher, lower):
            return  # solved at the first guess, or ended by an invalid first action
        g1, g2 = number(turns[0]["text"]), number(turns[2]["text"])
        if g1 is None:
            return
        self.after["higher" if turns[1]["text"] == higher else "lower"][None if g2 is None else g2 - g1] += 1

    @property
    def success(self) -> float:
        return self.solved / self.games if self.games else float("nan")

    def rate(self, feedback: str) -> float:
        """P(g2 > g1 | higher) or P(g2 < g1 | lower); NaN without such games."""
        counts = self.after[feedback]
        total = sum(counts.values())
        sign = 1 if feedback == "higher" else -1
        return sum(n for d, n in counts.items() if d is not None and d * sign > 0) / total if total else float("nan")

    def summary(self) -> dict:
        return {
            "games": self.games, "success": self.success,
            "p_higher_after_higher": self.rate("higher"), "p_lower_after_lower": self.rate("lower"),
            "n_after_higher": sum(self.after["higher"].values()),
            "n_after_lower": sum(self.after["lower"].values()),
            "step_after_higher": distribution(self.after["higher"]),
            "step_after_lower": distribution(self.after["lower"]),
        }


def number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def distribution(counts: Counter) -> str:
    """`-3:2 -1:5 +2:7 x:1` — counts of each g2 − g1 (x: not a number), in order."""
    keys = sorted(k for k in counts if k is not None)
    parts = [f"{k:+d}:{counts[k]}" for k in keys] + ([f"x:{counts[None]}"] if None in counts else [])
    return " ".join(parts) or "-"


def greedy_games(engine, policy, tokenizer, components, max_tokens: int) -> FeedbackCounts:
    """The trainer's held-out evaluation (rlvr/rollout/episodes.py `Episodes.evaluate`), keeping the transcripts."""
    from rlvr.distributed import World
    from rlvr.rollout import Episodes

    engine.sync(policy)
    rollout = Episodes(engine, tokenizer, components.env, components.seeds, World.single())
    played = rollout.evaluate(components.data.eval_examples(), max_tokens).turns
    assert played is not None, "episodes are played"
    game = components.env.env
    counts = FeedbackCounts()
    for transcript, reward in zip(played.transcripts, played.rewards_P_G.view(-1).tolist(), strict=True):
        counts.add(transcript, reward > 0.5, game.higher, game.lower)
    return counts


def measure(path: Path, overrides: list[str], conf: Path) -> dict[str, dict]:
    """{"warm-up": …, "checkpoint": …} summaries of the warm-up's policy and the checkpoint's."""
    from rlvr.cli.from_checkpoint import open_checkpoint
    from rlvr.run_weights import load_run_base
    from rlvr.start import local_policy

    opened = open_checkpoint(path, overrides, conf)
    c, max_tokens = opened.components, opened.config["trainer"]["eval_max_tokens"]
    if c.env is None or not hasattr(c.env.env, "higher"):
        raise SystemExit(f"{opened.run} did not train on env=guess (its env is {type(c.env and c.env.env).__name__})")
    try:
        trained = greedy_games(opened.engine, opened.backend.policy, opened.tokenizer, c, max_tokens)
        module, tokenizer = load_run_base(opened.run)
        backend, engine = local_policy(c, module, tokenizer)  # as the trainer (and open_checkpoint) builds them
        engine.connect()
        warm = greedy_games(engine, backend.policy, tokenizer, c, max_tokens)
    finally:
        opened.close()
    return {"warm-up": warm.summary(), f"step {opened.state['step']}": trained.summary()}


def render(results: dict[str, dict]) -> str:
    rows = [("games", "games", "d"), ("success", "success", ".3f"),
            ("P(g2 > g1 | higher)", "p_higher_after_higher", ".3f"),
            ("P(g2 < g1 | lower)", "p_lower_after_lower", ".3f"),
            ("games with g2 after higher", "n_after_higher", "d"), ("games with g2 after lower", "n_after_lower", "d")]
    names = list(results)
    lines = [f"{'':28}" + "".join(f"{n:>12}" for n in names)]
    lines += [f"{label:28}" + "".join(f"{format(results[n][key], fmt):>12}" for n in names) for label, key, fmt in rows]
    for n in names:
        lines.append(f"{n}: g2 - g1 after higher  {results[n]['step_after_higher']}")
        lines.append(f"{n}: g2 - g1 after lower   {results[n]['step_after_lower']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run folder or checkpoints/step_N folder of an env=guess run")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as `rlvr eval` takes them")
    parser.add_argument("--conf", type=Path, default=Path("conf"))
    args = parser.parse_args()
    print(render(measure(args.run, args.overrides, args.conf)))


if __name__ == "__main__":
    main()
