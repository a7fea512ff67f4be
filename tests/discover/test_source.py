"""TTT-Discover's data source (rlvr/discover/source.py): starts drawn by PUCT become memory prompts; the scored rows
join the archive under their starts; settings it cannot work with are refused."""

import pytest
import torch

from rlvr.discover.memory import Memory
from rlvr.discover.source import Discover
from rlvr.errors import ConfigError
from rlvr.stages.observe import DataObserver

TINY = Memory(prompt="{others}{start}", start="{text}=", other="{text}+{percent}+", context_k=1, start_chars=5,
              other_chars=5)


def source(**overrides) -> Discover:
    return Discover(**{"seed": 0, "statement": "", "reference": "4729", "batch_size": 2, "group_size": 2,
                       "memory": TINY, **overrides})


def test_rows_join_the_archive_under_their_starts():
    data = source()
    assert [e.prompt for e in data.batch(0, 2)] == ["=", "="]  # the root alone, twice
    fields = data.observe(["4000", "12", "4700", "x"], torch.tensor([[0.4, 0.1], [0.7, 0.0]]))
    assert fields == {"discover/best_reward": pytest.approx(0.7), "discover/archive_size": 5.0,
                      "discover/start_state_mean_reward": 0.0, "discover/max_depth": 1.0}
    # PUCT now: "4700" (id 3, reward 0.7) and "4000" (id 1, 0.4) lead; each prompt shows the best other entry
    examples = data.batch(1, 2)
    assert [e.prompt for e in examples] == ["4000+40+4700=", "4700+70+4000="]
    assert {e.reference for e in examples} == {"4729"}
    fields = data.observe(["4720", "4", "4", "4"], torch.tensor([[0.8, 0.0], [0.0, 0.0]]))
    assert fields["discover/start_state_mean_reward"] == pytest.approx((0.7 + 0.4) / 2)
    assert fields["discover/max_depth"] == 2.0 and data.archive.entries[5].parent == 3


def test_the_archive_is_its_checkpoint_state():
    data = source()
    data.batch(0, 2)
    data.observe(["4000", "12", "4700", "x"], torch.tensor([[0.4, 0.1], [0.7, 0.0]]))
    again = source()
    DataObserver(again).load_state_dict(DataObserver(data).state_dict())
    assert again.archive.state_dict() == data.archive.state_dict()
    assert [e.prompt for e in again.batch(1, 2)] == [e.prompt for e in data.batch(1, 2)]
    with pytest.raises(ConfigError, match="holds no discover archive"):  # a checkpoint of another data source
        DataObserver(source()).load_state_dict({})
    assert "observes_steps" in Discover.needs({}).provides  # what rlvr/build.py adds the observing stage by


@pytest.mark.parametrize(("key", "value", "match"), [
    ("off_policy_steps", 1, "trainer.off_policy_steps=1"),
    ("dynamic_sampling", "filter", "trainer.dynamic_sampling=filter"),
    ("puct_c", -1.0, "data.puct_c=-1.0"),
    ("archive_max_entries", 0, "data.archive_max_entries=0"),
])
def test_settings_it_cannot_work_with_are_refused(key, value, match):
    with pytest.raises(ConfigError, match=match):
        source(**{key: value})


def test_trainer_discover_and_data_discover_come_together_or_are_refused(monkeypatch):
    from rlvr import config_check

    choices = {"trainer": "discover", "data": "arithmetic"}
    monkeypatch.setattr(config_check, "hydra_choice", choices.get)
    assert config_check.discover_errors() == [
        "TTT-Discover is trainer=discover over data=discover (trainer=discover and data=arithmetic were chosen): run "
        "`python train.py trainer=discover`, which selects data=discover, reward=closeness and "
        "algorithm=discover_entropic"]
    choices.update(trainer="cpu", data="discover")
    assert "trainer=cpu and data=discover were chosen" in config_check.discover_errors()[0]
    choices["trainer"] = "discover"
    assert config_check.discover_errors() == []
