"""rlvr's launchers, registered with Hydra: it takes a launcher only from a class defined in the `hydra_plugins`
package. The launchers themselves are in rlvr/launcher/packed.py."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

from rlvr.launcher.packed import PackedLauncher as _Packed
from rlvr.launcher.packed import SlurmPacks


class PackedLauncher(_Packed):
    """`hydra/launcher=packed` (conf/hydra/launcher/packed.yaml): rlvr.launcher.packed.PackedLauncher."""


class PackedSlurmLauncher(SlurmPacks, SlurmLauncher):
    """`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml): submitit's, with `pack_size` runs a task."""


@dataclass
class PackedSlurmConf(SlurmQueueConf):
    """submitit's SLURM keys, and `pack_size`: the runs of one task (1: one run a task, as submitit runs them)."""

    _target_: str = "hydra_plugins.rlvr_launchers.PackedSlurmLauncher"
    pack_size: int = 1


ConfigStore.instance().store(group="hydra/launcher", name="submitit_slurm_packed", node=PackedSlurmConf,
                             provider="rlvr")
