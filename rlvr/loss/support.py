"""What of `algorithm.loss` a backend that computes the loss on its own side (a service, another trainer) can do.

backend=local and fsdp call `algorithm.loss` themselves, so they compute any loss, a user's own included, and
declare nothing. A backend that hands the step to something else declares a `LossSupport` as its class attribute
`loss_support`; a setting outside it is refused at start (`support_errors`, from rlvr/config_check.py) and at the
backend's first step (`refuse`), naming the key and what the backend supports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.errors import ConfigError
from rlvr.loss.aggregation import AGGREGATIONS


@dataclass(frozen=True)
class LossSupport:
    forms: tuple[str, ...] = ("ppo",)
    """The forms (`algorithm.loss.form`, and the covariance `mode`s) computed: rlvr/loss/forms.py `FORMS` keys."""
    aggregations: tuple[str, ...] = AGGREGATIONS
    entropy_bonus: bool = False

    def problems(self, backend: str, settings: Mapping[str, Any], custom: bool) -> list[str]:
        """One line per setting of `algorithm.loss` (plain values, `custom`: its `_target_` is a user's loss) that
        `backend` does not compute."""
        errors = []
        if custom:
            errors.append(f"algorithm.loss._target_={settings.get('_target_', 'a user loss')}: {backend} computes "
                          "its own loss, not a user's (rlvr.algorithm.loss.PolicyLoss only)")
        mode = settings.get("mode", "standard")
        key, form = ("mode", mode) if mode != "standard" else ("form", settings.get("form", "ppo"))
        if form not in self.forms:
            errors.append(f"algorithm.loss.{key}={form}: {backend} computes the form(s) {', '.join(self.forms)} "
                          f"only{' (mode=standard)' if key == 'mode' else ''}")
        aggregation = settings.get("aggregation", "token_mean")
        if aggregation not in self.aggregations:
            errors.append(f"algorithm.loss.aggregation={aggregation}: {backend} aggregates by "
                          f"{', '.join(self.aggregations)} only")
        if settings.get("entropy_coef") and not self.entropy_bonus:
            errors.append(f"algorithm.entropy_coef={settings['entropy_coef']}: {backend} computes no entropy bonus "
                          "(set it to 0, or choose backend=local or fsdp)")
        return errors

    def refuse(self, backend: str, loss: Any) -> None:
        """ConfigError unless `loss` (a built `algorithm.loss`) is within what `backend` computes."""
        errors = self.problems(backend, vars(loss), getattr(loss, "custom", None) is not None)
        if errors:
            raise ConfigError("; ".join(errors))


def support_errors(backend_class: type, backend_target: str, loss_settings: Any, custom: bool) -> list[str]:
    """At start: what of `algorithm.loss` (its resolved node; `custom`: a user's own loss) the chosen backend
    declares it does not compute."""
    support = getattr(backend_class, "loss_support", None)
    if support is None or not loss_settings:
        return []
    return support.problems(f"backend <{backend_target}>", loss_settings, custom)
