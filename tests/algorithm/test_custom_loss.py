"""A user's own loss by import path (`algorithm.loss._target_=my_losses.my_loss`, rlvr/algorithm/custom_loss.py):
built from the composed config, trained with in a real local train step, and refused by a backend that computes
its own loss."""

import pytest
import torch

from composing import compose_config
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.config_check import config_problems
from rlvr.model.tiny import TinyLlama
from rlvr.types import Rollouts, TrainBatch

TINY = TinyLlama("0123456789+=", 32, 64, 2, 2, 32, "float32", None)


@pytest.fixture(autouse=True)
def importable(monkeypatch, request):
    monkeypatch.syspath_prepend(str(request.path.parent))  # my_losses.py, as a user's module on PYTHONPATH


def step(loss: PolicyLoss) -> dict[str, float]:
    """One train step of the tiny model on 4 rows (2 prompts × 2) whose engine log-probs are off by up to ±0.3."""
    model, tok = TINY.load(0)
    backend = LocalBackend(model, None, 0, tok.pad_token_id, "cpu", (0.9, 0.999), 1e-8, 0.0, 0.0, 2, False)
    gen = torch.Generator().manual_seed(0)
    tokens, mask = torch.randint(0, 12, (4, 5), generator=gen), torch.ones(4, 5, dtype=torch.bool)
    mask[3, 3:] = False
    engine_lp = -torch.rand(4, 5, generator=gen) * mask
    ro = Rollouts(prompt_ids_P=[[3, 4], [5]], group_size=2, tokens_PG_T=tokens, logprobs_PG_T=engine_lp,
                  mask_PG_T=mask, finished_PG=torch.ones(4, dtype=torch.bool), temperature=1.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(4, 5) * mask
    return backend.train_step(TrainBatch(ro, adv.contiguous()), loss, 1e-3)


def built(target: str, *overrides: str) -> PolicyLoss:
    from hydra.utils import instantiate

    cfg = compose_config([f"algorithm.loss._target_={target}", *overrides])
    return instantiate(cfg.algorithm, _convert_="all").loss


def test_a_user_loss_by_import_path_trains_as_the_built_in_it_rewrites():
    mine = built("my_losses.my_loss", "algorithm.loss.aggregation=seq_mean_token_mean")
    assert isinstance(mine, PolicyLoss) and mine.custom is not None and mine.aggregation == "seq_mean_token_mean"
    ours = step(PolicyLoss(0.0, 0.0, 0.0, aggregation="seq_mean_token_mean"))
    theirs = step(mine)
    assert theirs["loss"] == ours["loss"] and theirs["grad_norm"] == ours["grad_norm"]  # the same operations
    twice = step(built("my_losses.doubled", "algorithm.loss.aggregation=seq_mean_token_mean"))
    assert twice["loss"] == pytest.approx(2 * ours["loss"])
    assert twice["grad_norm"] == pytest.approx(2 * ours["grad_norm"])


def test_a_form_of_ones_own_by_import_path_is_weighed_and_aggregated_as_a_built_in():
    """`algorithm.loss.form=my_losses.doubled_ppo`: twice ppo's per-token loss, so twice the step's loss and
    gradient (ppo's clipping inside); a path that imports nothing is refused when the loss is built."""
    ours = step(built("rlvr.algorithm.loss.PolicyLoss"))
    theirs = step(built("rlvr.algorithm.loss.PolicyLoss", "algorithm.loss.form=my_losses.doubled_ppo"))
    assert theirs["loss"] == pytest.approx(2 * ours["loss"])
    assert theirs["grad_norm"] == pytest.approx(2 * ours["grad_norm"])
    with pytest.raises(Exception, match="my_losses.nothing.* must be one of ppo, gspo, cispo, or the import path"):
        built("rlvr.algorithm.loss.PolicyLoss", "algorithm.loss.form=my_losses.nothing")


@pytest.mark.parametrize("backend", ["tinker", "prime_rl"])
def test_a_backend_that_computes_its_own_loss_refuses_a_user_loss_at_start(backend):
    cfg = compose_config(["algorithm.loss._target_=my_losses.my_loss", f"backend={backend}"])
    _, errors = config_problems(cfg, at_start=False)
    assert any("algorithm.loss._target_=my_losses.my_loss" in e and "not a user's" in e for e in errors), errors
    _, local = config_problems(compose_config(["algorithm.loss._target_=my_losses.my_loss"]), at_start=False)
    assert not any("algorithm.loss" in e for e in local), local
