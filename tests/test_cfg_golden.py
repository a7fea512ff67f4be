"""`python train.py <group>=<option> --cfg job` of every option equals its golden text (tests/fixtures/
cfg_job_golden.txt), key order included: restructuring conf/ (options extending each other through defaults
lists) must not change any composed config, and a new or changed option updates the golden deliberately
(`python tests/fixtures/make_cfg_golden.py`, then review the diff)."""

import pytest

from composing import DEFAULT, HYDRA_SUFFIX, cfg_job_texts, option_overrides, read_golden

KEYS = [DEFAULT, *option_overrides()]


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    return read_golden()


@pytest.fixture(scope="module")
def composed() -> dict[str, str]:
    return cfg_job_texts()  # every option in one Hydra initialisation (~0.2 s each)


def test_every_option_file_has_a_golden_entry_and_no_entry_is_stale(golden):
    options = {key for key in golden if not key.endswith(HYDRA_SUFFIX)}
    missing, stale = sorted(set(KEYS) - options), sorted(options - set(KEYS))
    assert not missing, f"no golden --cfg job text for {missing}: run python tests/fixtures/make_cfg_golden.py"
    assert not stale, f"golden entries without an option file: {stale}: run python tests/fixtures/make_cfg_golden.py"


@pytest.mark.parametrize("key", KEYS)
def test_cfg_job_is_the_golden_text(key, golden, composed):
    if key not in golden:
        pytest.fail(f"no golden entry for {key}: run python tests/fixtures/make_cfg_golden.py and review the diff")
    assert composed[key] == golden[key]
    # the hydra keys an option sets (campaigns: mode, sweep, sweeper, callbacks): as recorded, or the default's
    hydra = golden.get(key + HYDRA_SUFFIX, golden[DEFAULT + HYDRA_SUFFIX])
    assert composed.get(key + HYDRA_SUFFIX, composed[DEFAULT + HYDRA_SUFFIX]) == hydra
