"""The checkpoint commands build their components with the run's own builder (rlvr/build.py, rlvr/start.py), not
the training loop's: importing them imports neither rlvr/trainer.py nor a stage of the step, and the components
they build have no stages (the config check reads the trainer node's class, as it reads every node's)."""

import subprocess
import sys

CHECK = """
import sys
from hydra import compose, initialize_config_dir
import rlvr.cli.main, rlvr.cli.eval_checkpoint, rlvr.cli.sample, rlvr.cli.export, rlvr.cli.replay, rlvr.start
from rlvr.build import build_components
from rlvr.labels import register_resolvers
print(sorted(m for m in sys.modules if m == "rlvr.trainer" or m.startswith("rlvr.stages")))
register_resolvers()
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    components = build_components(compose("train"))
assert components.stages == [], components.stages
"""


def test_the_cli_never_imports_the_training_loop(tmp_path):
    from pathlib import Path

    conf = Path(__file__).resolve().parents[2] / "conf"
    out = subprocess.run([sys.executable, "-c", CHECK, str(conf)], capture_output=True, text=True, cwd=tmp_path,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
