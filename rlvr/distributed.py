"""One run over several processes: who this process is, and the few collectives the loop needs.

A run becomes distributed when it is started as several processes: by `torchrun --nproc-per-node N train.py …`
(torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or as a SLURM job of several tasks
(`hydra/launcher=slurm hydra.launcher.tasks_per_node=N`, `nodes=M`: srun starts one task per process and sets
SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the rendezvous is the job's first node, at a port derived from the
job id). `World.from_env()` reads either; one process (`python train.py`) is `World.single()`, and then
its sharing and gathering are the identity (`World.share`, `gather`, `on_main`, `barrier`, `gather_step`).

How a distributed step is shared (rlvr/trainer.py, rlvr/backend/fsdp.py):

- every rank draws the same step's prompts (the data order is a function of seed and step) and samples its
  own contiguous share of whole groups, one sampling generator per group seeded by the group's position in
  the data stream, so the rollouts do not depend on how many ranks share them; it scores them itself (multi-turn:
  each rank plays its share of the games, every episode from its own seeds, rlvr/rollout/episodes.py);
- the rollouts and rewards are gathered to every rank (`gather_step`, `gather_played`), so credit
  assignment, the transforms' controllers, back pressure and the metrics row are computed on the whole step,
  identically on every rank: their state needs no communication;
- the backend trains each rank's share of the rows (balanced over the rows that carry signal), and FSDP2 sums
  the gradients: the update is the single-process update on the same rows;
- evaluation is shared the same way: each rank decodes and scores its share of the held-out set, gathered;
- rank 0 alone writes the run folder; every rank writes its shard of a checkpoint (torch.distributed.checkpoint)
  and rank 0 completes it (rlvr/checkpoint.py);
- a stop signal seen by any rank stops all of them at the same step boundary (rlvr/trainer.py: _stopping).

Collectives run on the default process group: NCCL on GPUs, gloo on CPUs, with `timeout_s` on every one, so a
rank that died makes the others fail within that bound instead of hanging (torchrun and srun
`--kill-on-bad-exit` also end the others as soon as one exits with an error).
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.preemption import StepInterrupted

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.types import EnvFailures, Played, Rollouts, Scores

torch = lazy_import("torch")
dist = lazy_import("torch.distributed")

PORT_BASE = 20_000
"""A SLURM job's rendezvous port is PORT_BASE + job id mod 20,000 (torchrun gives its own)."""


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    """This process's index on its node: its GPU."""

    @classmethod
    def single(cls) -> World:
        return cls(0, 1, 0)

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None) -> World:
        """torchrun's variables, else a SLURM step's of several tasks, else one process. Sets MASTER_ADDR and
        MASTER_PORT from the SLURM job when torchrun did not (env:// initialisation reads them)."""
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" in env and "RANK" in env:
            return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))
        if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
            if "MASTER_ADDR" not in env:  # scontrol only when asked: this is read several times a run
                env["MASTER_ADDR"] = first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", ""))
            env.setdefault("MASTER_PORT", str(PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % 20_000))
            local = int(env.get("SLURM_LOCALID", 0))
            # `gpus_per_task` binds each task to its own GPUs (sbatch: an implicit --gpu-bind=per_task), so
            # CUDA_VISIBLE_DEVICES lists only those and the task's GPU is cuda:0, not cuda:<SLURM_LOCALID>; with
            # the node's GPUs visible to every task (`gres: gpu:N`), it is cuda:<SLURM_LOCALID>
            visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            return cls(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), local % len(visible) if visible else local)
        return cls.single()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (a world of one: `[value]`, no process group needed)."""
        return [value] if self.size == 1 else all_gather(value)

    def barrier(self) -> None:
        """Wait for every rank (a world of one: nothing to wait for)."""
        if self.size > 1:
            dist.barrier()

    def on_main(self, fn, *args):
        """`fn(*args)` computed on rank 0 (deciding the run folder, say), its result on every rank; an exception it
        raises is raised on every rank, so none waits for a broadcast that never comes. A world of one: a call."""
        return fn(*args) if self.size == 1 else on_main(fn, *args)

    def share(self, count: int) -> range:
        """This rank's contiguous share of `count` items (the first `count % size` ranks take one more)."""
        base, extra = divmod(count, self.size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))


ONE_PROCESS = World.single()
"""`python train.py`: the world of one process."""


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (`node[01-04],gpu7` → node01), as `scontrol show hostnames` says."""
    if not nodelist:
        return "127.0.0.1"
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    # no scontrol here: the list's first entry with each [range] at its first element, as scontrol expands it
    first = re.split(r",(?![^\[]*\])", nodelist)[0]  # a comma inside [...] separates ranges, not hosts
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], first)


def init(world: World, device: str, timeout_s: float) -> None:
    """Join the run's process group (env://): NCCL when this process trains on a GPU, else gloo. A world of one
    process gets a group of one (FSDP2 needs a device mesh) with no rendezvous. Idempotent."""
    if dist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(world.local_rank)
    if world.size == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=timeout)


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_gather(value: Any) -> list[Any]:
    """Every rank's `value` (any picklable object), in rank order."""
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(fn, *args):
    """`fn(*args)` computed on rank 0 (deciding the run folder, say), its result on every rank; an exception it
    raises is raised on every rank, so none waits for a broadcast that never comes."""
    if dist.get_rank() == 0:
        try:
            result = (True, fn(*args))
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below
            result = (False, err)
    else:
        result = None
    ok, value = broadcast(result)
    if not ok:
        raise value
    return value


def gather_step(world: World, rollouts: Rollouts, completions: list[str], scores: Scores | None, pad_id: int
                ) -> tuple[Rollouts, list[str], Scores]:
    """The whole step's rollouts, decoded completions and scores on every rank, from each rank's share (in a world
    of one process: as given). `scores` is None on a rank whose scoring a stop signal interrupted: then every rank
    raises StepInterrupted once all have come, so each drops the step and none waits in a collective the others
    left (a rank going on to checkpoint while another gathers would hang both)."""
    from rlvr.types import Scores

    if world.size == 1:
        if scores is None:
            raise StepInterrupted("a stop signal while scoring")
        return rollouts, completions, scores
    parts = all_gather((completions, scores))
    stopped = [rank for rank, (_, s) in enumerate(parts) if s is None]
    if stopped:
        raise StepInterrupted(f"a stop signal reached rank {stopped[0]} while it scored")
    merged = Scores(values=[v for _, s in parts for v in s.values], timeouts=sum(s.timeouts for _, s in parts),
                    errors=sum(s.errors for _, s in parts), parse_failures=sum(s.parse_failures for _, s in parts))
    return gather_rollouts(rollouts, pad_id), [c for cs, _ in parts for c in cs], merged


def gather_played(world: World, played: Played, failures: EnvFailures, pad_id: int
                  ) -> tuple[Played, EnvFailures]:
    """The whole step's played episodes and environment failures on every rank, from each rank's share of the
    groups (in a world of one process: as given). Environment time is the slowest rank's."""
    from dataclasses import fields, replace

    from rlvr.types import EnvFailures

    if world.size == 1:
        return played, failures
    mine = {f.name: getattr(played, f.name) for f in fields(played) if f.name != "rollouts"}
    parts: list[tuple[dict[str, Any], EnvFailures]] = all_gather((mine, failures))
    shares = [share for share, _ in parts]
    counts = [count for _, count in parts]
    branches = [share["branch_rewards_PG_K_B"] for share in shares]
    return replace(
        played,
        rollouts=gather_rollouts(played.rollouts, pad_id),
        rewards_P_G=torch.cat([share["rewards_P_G"] for share in shares]),
        turn_rewards_PG_K=_cat_padded([share["turn_rewards_PG_K"] for share in shares], float("nan")),
        turns_PG=torch.cat([share["turns_PG"] for share in shares]),
        truncated_PG=torch.cat([share["truncated_PG"] for share in shares]),
        failed_PG=torch.cat([share["failed_PG"] for share in shares]),
        transcripts=[t for share in shares for t in share["transcripts"]],
        infos=[i for share in shares for i in share["infos"]],
        env_seconds=max(share["env_seconds"] for share in shares),
        branch_rewards_PG_K_B=None if branches[0] is None else _cat_padded(branches, float("nan")),
        probe_seconds=max(share["probe_seconds"] for share in shares),
        rewritten_turns=None if shares[0]["rewritten_turns"] is None
        else [t for share in shares for t in share["rewritten_turns"]],
    ), EnvFailures(sum(c.episodes for c in counts), sum(c.errors for c in counts), sum(c.timeouts for c in counts))


def gather_rollouts(rollouts: Rollouts, pad_id: int) -> Rollouts:
    """The whole step's rollouts on every rank: each rank's share, in rank order (= the groups' order), padded
    to the longest row with `pad_id` (multi-turn rows: action marks False, turn index −1 on the padding)."""
    from rlvr.types import cat_rollouts

    return cat_rollouts(all_gather(rollouts), pad_id)


def _cat_padded(parts: list[Tensor], fill: float | int | bool) -> Tensor:
    """`parts` concatenated along dim 0, each padded along dim 1 to the widest with `fill`."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.cat([p, p.new_full((p.shape[0], width - p.shape[1], *p.shape[2:]), fill)], dim=1)
                      for p in parts])
