"""rlvr's launchers, registered with Hydra: it takes a launcher only from a class defined in the `hydra_plugins`
package. The launcher itself is rlvr/launcher/packed.py."""

from rlvr.launcher.packed import PackedLauncher as _Packed


class PackedLauncher(_Packed):
    """`hydra/launcher=packed` (conf/hydra/launcher/packed.yaml): rlvr.launcher.packed.PackedLauncher."""
