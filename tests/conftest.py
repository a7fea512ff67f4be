import os

# Tests never touch the network: any hub access fails fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def warm(tmp_path_factory):
    """Overrides that start RL from the default recipe's 800-step warm-up (~50 s on 1 thread), trained by
    the first test that asks and then loaded from a cache shared by the whole session."""
    cache = tmp_path_factory.mktemp("warmup-cache")
    return ["trainer.warmup.steps=800", f"trainer.warmup.cache_dir={cache}", "threads=1"]
