"""A small verifiers taskset with tools, written with verifiers' own API (0.4.0, `verifiers.v1`: Taskset, Task,
Toolset with `@vf.tool`, State, `@vf.reward`) over a local dataset, played through rlvr's tool harness by
tests/env/test_verifiers_tools.py. verifiers 0.4.0 ships no taskset with tools that runs offline (its Harbor and NeMo
Gym tasksets need their servers), hence this one.

Task i asks for the code filed under key "k{i}"; the task's toolset (`LookupToolset`, one per rollout, set up with
its task's table by `setup_task`) answers `lookup_toolset_lookup(key)` and counts the lookups in the rollout's
state. The rubric: `correct` (weight 1) when the last reply is the code, `looked_up` (weight 0.5) when a tool
looked it up (read from `trace.state`), so a right answer found with the tool scores 1.5. Taskset knob `url` puts
the toolset on a remote MCP server (which rlvr refuses)."""

import verifiers.v1 as vf

CODES = ["417", "902", "365", "58"]


class LookupData(vf.TaskData):
    table: dict[str, str]
    key: str


class LookupState(vf.State):
    lookups: int = 0


class LookupToolset(vf.Toolset[vf.ToolsetConfig, LookupState]):
    async def setup_task(self, task) -> None:
        self.table = dict(task.data.table)

    @vf.tool
    def lookup(self, key: str) -> str:
        """The code filed under a key."""
        self.state.lookups += 1
        return self.table[key]


class LookupTaskConfig(vf.TaskConfig):
    url: str | None = None


class LookupTask(vf.Task[LookupData, LookupState, LookupTaskConfig]):
    @classmethod
    def toolsets(cls, config: LookupTaskConfig) -> list[vf.Toolset]:
        return [LookupToolset(vf.ToolsetConfig(url=config.url))]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        said = [(m.content or "").strip() for m in trace.assistant_messages]
        return float(bool(said) and said[-1] == self.data.table[self.data.key])

    @vf.reward(weight=0.5)
    async def looked_up(self, trace: vf.Trace) -> float:
        return float(trace.state.lookups > 0)


class LookupConfig(vf.TasksetConfig):
    task: LookupTaskConfig = LookupTaskConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self):
        table = {f"k{i}": code for i, code in enumerate(CODES)}
        for i in range(len(CODES)):
            yield LookupTask(LookupData(prompt=f"What is the code of key k{i}?", table=table, key=f"k{i}"),
                             self.config.task)


__all__ = ["LookupTaskset"]
