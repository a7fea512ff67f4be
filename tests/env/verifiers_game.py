"""A small verifiers environment written with verifiers' own API (0.4.0, `verifiers.v1`), played through rlvr by
tests/env/test_verifiers.py: "guess my digit, then confirm it".

The task's prompt asks for a digit; the Env (`GuessEnv.run`, a seat's `interaction`) answers the first reply with a
verdict ("Right." or "No, it is D.") and asks for the digit again; the task's rubric (`@vf.reward correct`) scores
the last reply: 1 when it is the secret digit, else 0 (`@vf.metric first_right`: the first reply was). Task i's
secret is (3i + 1) % 10. Paired with verifiers' own `single_agent` env (EnvConfig `id: single_agent`) the same
taskset is one turn: the prompt, one reply, scored. The taskset's knobs (`taskset:` in the EnvConfig) set its texts
(model=tiny reads only digits, + and =), and `broken`/`stall_s` make the Env raise or hang after the first reply."""

import asyncio

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


def replies(trace: vf.Trace) -> list[str]:
    return [(m.content or "").strip() for m in trace.assistant_messages]


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        said = replies(trace)
        return float(bool(said) and said[-1] == str(self.data.secret))

    @vf.metric
    async def first_right(self, trace: vf.Trace) -> float:
        said = replies(trace)
        return float(bool(said) and said[0] == str(self.data.secret))


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 4
    prompt: str = "Guess my digit (0-9)."
    system: str | None = "Answer with one digit."
    right: str = "Right. Say the digit again to confirm."
    wrong: str = "No, it is {secret}. Say the digit again to confirm."
    broken: bool = False
    """The Env raises after the first reply."""
    stall_s: float = 0.0
    """The Env sleeps this long after the first reply."""


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            data = GuessData(prompt=self.config.prompt, system_prompt=self.config.system, secret=(3 * i + 1) % 10)
            yield GuessTask(data, self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        config = self.taskset.config
        async with agents.player.interaction(task) as interaction:
            first = await interaction.turn()
            if first.terminated:
                return
            if config.broken:
                raise RuntimeError("broken on purpose")
            await asyncio.sleep(config.stall_s)
            secret = str(task.data.secret)
            await interaction.turn(config.right if first.last_reply == secret else config.wrong.format(secret=secret))


__all__ = ["GuessEnv", "GuessTaskset"]
