"""Composing the real conf/ in tests, exactly as `python train.py <overrides>` does."""

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: list[str]):
    """The real composed config (conf/train.yaml) with overrides, as `python train.py <overrides>` sees it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


# Settings that keep a real run of the embedded default CPU-test sized: no warm-up cache in $HOME,
# a small held-out set, and 1 thread (pytest may share the 2 cores with another job).
FAST = [
    "trainer.warmup.steps=0",
    "trainer.warmup.cache_dir=null",
    "trainer.eval_every=0",
    "trainer.log_every=1",
    "data.eval_size=64",
    "threads=1",
]
