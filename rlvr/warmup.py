"""The SFT warm-up phase (retrain's, reshaped): supervised steps on the data source's demonstrations,
run before RL on all weights of the base model, cached so a second run with the same inputs skips it.
retrain's warm-up is described in docs/predecessor.md#the-training-step.

Each step draws `batch_size` demonstrations in the seeded order of rlvr/data/order.py, tokenizes
`prompt + completion + EOS`, and minimises the mean cross-entropy over completion tokens (EOS
included; prompt tokens are not supervised). A multi-turn demonstration (an environment's game, `followups`)
is encoded as the rollout loop encodes an episode (rlvr/rollout/episodes.py): the prompt as `encode_prompts` does,
or shown with the tools' schemas when the tool harness marked it (`ToolPrompt`, rlvr/tools/harness.py); each
observation as `encode_observation` does, a `ToolTurn` as a tool-role turn; only the actions (each + EOS) are
supervised. So a demonstration that calls a tool trains the same tokens, in the same context, as an RL row
that does (env=calculator). Optimizer: AdamW with betas (0.9, 0.999), no weight decay,
constant `lr`.

Deliberate differences from the predecessor: the warm-up has its own step counter and its own rows
(`warmup.jsonl`), so RL step indices and `metrics.jsonl` are the same whether the warm-up ran or came
from the cache; it trains the base weights (LoRA is attached afterwards), because a low-rank adapter
cannot reach the warm-up's target on the tiny model; its loss is plain cross-entropy, not the
predecessor's `−exp(logp)` importance-sampling form.

Cache: `<cache_dir>/<key>/model.safetensors`, where key = sha256 of what changes the result (`cache_key`:
the model preset, the warm-up knobs, the init seed, the demonstrations, the torch version and thread
count; not evaluation settings). Written under a temporary name and renamed, so a killed run never
leaves a half-written entry. While one run trains an entry, it holds `<cache_dir>/.<key>.lock` (`flock`): another
run of the same key (a grid's cells of one seed started at once) waits for it and loads its result instead of
training the same warm-up beside it. The ranks of a distributed run each train it, as before: rank 0, which writes
the run folder, takes the lock; the others train beside it without.
A run also keeps the warm-up's result in its own folder (`base/`, with the key in base.json): a run
resumed where the cache is empty (another machine) loads it from there instead of recomputing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.data.order import batch_indices
from rlvr.lazy import lazy_import
from rlvr.model.base_folder import BASE_FILE, WEIGHTS, read_record, verify_weights
from rlvr.model.prompt_encoding import encode_prompts
from rlvr.tools.harness import ToolPrompt, ToolTurn
from rlvr.types import Demonstration

if TYPE_CHECKING:
    from torch import Tensor, nn
    from torch import device as Device
    from transformers import PreTrainedTokenizerBase

torch = lazy_import("torch")
safetensors_torch = lazy_import("safetensors.torch")
log = logging.getLogger("rlvr")

LOCK_POLL_S = 0.2
"""How often a run waiting for another run's warm-up of the same key looks again (and calls its `on_wait`)."""


TOOL_TURNS_ENCODING = 2
"""How tool calls and results are encoded (rlvr/chat/tools.py `tool_messages`, rlvr/chat/turns.py
`after_turn`), in the cache key of demonstrations with tools: raised when that encoding changes, so a warm-up cached
under the old one is not loaded for the new. 2: a tool turn follows the calling turn's end-of-turn token (Qwen3's
template rewrites the turn), and a template that does not show the `tool` role gets the results as a user message."""


@dataclass(frozen=True)
class Warmup:
    steps: int
    batch_size: int
    lr: float
    cache_dir: str | None
    """null disables the cache."""

    def cache_key(self, model_preset: object, seed: int, demos: list[Demonstration]) -> str:
        """sha256 of what the warm-up's result depends on: the model preset (less its LoRA settings), the
        warm-up's steps, batch size and learning rate, the init seed, the demonstrations, the torch version and
        its thread count (CPU kernels split their sums by thread: 1 and 2 threads give other weights), and for
        demonstrations with tools `TOOL_TURNS_ENCODING`. Evaluation settings (data.eval_size, …) and the cache folder
        are not in it."""
        preset = (asdict(model_preset) if is_dataclass(model_preset) and not isinstance(model_preset, type)
                  else repr(model_preset))
        preset = ({k: v for k, v in preset.items() if k != "lora" and not (k == "chat_template" and v is None)}
                  if isinstance(preset, dict) else preset)  # no template: the key a preset without one had
        h = hashlib.sha256()
        h.update(json.dumps([preset, self.steps, self.batch_size, self.lr, seed, torch.__version__,
                             torch.get_num_threads()], sort_keys=True).encode())
        if any(isinstance(d.prompt, ToolPrompt) or any(isinstance(t, ToolTurn) for t in d.followups) for d in demos):
            h.update(f"tool turns {TOOL_TURNS_ENCODING}".encode())
        for d in demos:
            h.update(f"{d.prompt}\x00{d.completion}\x01".encode())
            if isinstance(d.prompt, ToolPrompt):
                h.update(json.dumps(d.prompt.schemas, sort_keys=True).encode() + b"\x04")
            if d.followups:
                h.update("\x02".join(d.followups).encode() + b"\x03")
                h.update(bytes(isinstance(t, ToolTurn) for t in d.followups))
        return h.hexdigest()[:20]

    def run(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        demos: list[Demonstration],
        seed: int,
        key: str,
        on_step: Callable[[dict], None],
        run_copy: Path | None = None,
        on_wait: Callable[[], None] | None = lambda: None,
    ) -> dict:
        """Train `model` in place, or load its result from the cache or from `run_copy` (a run folder's base/,
        which records the key it was trained under: a run moved to another machine continues without
        recomputing). `on_step` gets each step's row (one row for a load) and may raise to stop the warm-up;
        `on_wait` is called while another process trains the same entry (`entry_lock`), and may raise to stop
        waiting; None: train beside it without the lock (a distributed run's ranks other than 0, so that rank 0,
        which writes the run folder, is the one that trains). Returns facts for summary.json."""
        entry = Path(os.path.expanduser(self.cache_dir)) / key if self.cache_dir else None
        facts = {"steps": self.steps, "key": key, "cache_entry": str(entry) if entry else None}
        found = self._load(model, entry, run_copy, key, on_step, facts)
        if found is not None or entry is None:
            return found or self._train(model, tokenizer, demos, seed, on_step, facts)
        with entry_lock(entry, on_wait) if on_wait is not None else nullcontext():
            found = self._load(model, entry, None, key, on_step, facts)  # filled by the run we waited for
            if found is not None:
                return found
            info = self._train(model, tokenizer, demos, seed, on_step, facts)
            self._fill(entry, model)
            return info

    def _load(self, model: nn.Module, entry: Path | None, run_copy: Path | None, key: str,
              on_step: Callable[[dict], None], facts: dict) -> dict | None:
        """The warm-up's result loaded into `model` from the cache entry or `run_copy` (which then fills the
        entry), and its facts; None when neither holds it."""
        for source in (entry, run_copy):
            weights = stored_weights(source, key)
            if weights is not None:
                safetensors_torch.load_model(model, weights)
                if source == run_copy and entry is not None:
                    self._fill(entry, model)
                on_step({"step": self.steps, "steps": self.steps, "loaded_from": str(source)})
                return {**facts, "loaded_from": str(source), "seconds": 0.0, "final_loss": None}
        return None

    def _train(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, demos: list[Demonstration], seed: int,
               on_step: Callable[[dict], None], facts: dict) -> dict:
        """The warm-up's steps on `model` (module docstring), each one's row to `on_step`; its facts."""
        t0 = time.perf_counter()
        device = next(model.parameters()).device
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr, betas=(0.9, 0.999), weight_decay=0.0)
        model.train()
        loss_value, encoded = None, _Encoded(tokenizer, demos)
        for step in range(self.steps):
            ids, labels, attn = encoded.batch(batch_indices(step, self.batch_size, len(demos), seed), device)
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_value = float(loss.detach())
            on_step({"step": step, "steps": self.steps, "loss": loss_value, "lr": self.lr})
        return {**facts, "loaded_from": None, "seconds": time.perf_counter() - t0, "final_loss": loss_value}

    @staticmethod
    def _fill(entry: Path, model: nn.Module) -> None:
        """Write the cache entry under a temporary name, then rename it into place."""
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        safetensors_torch.save_model(model, str(tmp / WEIGHTS))
        try:
            tmp.rename(entry)
        except OSError:  # another run filled the same entry first: identical content, keep theirs
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def entry_lock(entry: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """Held while this run trains cache `entry`: an exclusive `flock` on `.<key>.lock` beside it. A run that finds it
    held waits, calling `on_wait` every `LOCK_POLL_S`, until the run holding it ends (a killed run's lock goes with
    its process). Where the file system takes no locks, the run trains without one, as before locks."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(f".{entry.name}.lock"), "a") as held:
        try:
            if not try_lock(held):
                log.info("another process is training this warm-up (%s): waiting for it, to load its result", entry)
                while not try_lock(held):
                    on_wait()
                    time.sleep(LOCK_POLL_S)
        except OSError as e:
            log.info("no lock on %s (%s): training the warm-up without one", entry.parent, e)
        yield


def try_lock(held) -> bool:
    """Whether this process now holds `held`'s exclusive lock."""
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def stored_weights(folder: Path | None, key: str) -> Path | None:
    """`folder/model.safetensors` when `folder` holds the warm-up result for `key`: a cache entry (named by its
    key), or a run folder's base/ whose base.json records the key (its sha256 checked)."""
    if folder is None or not (folder / WEIGHTS).is_file():
        return None
    if folder.name == key:
        return folder / WEIGHTS
    if not (folder / BASE_FILE).is_file():
        return None
    record = read_record(folder)
    if record.get("warmup_key") != key:
        return None
    verify_weights(folder, record)
    return folder / WEIGHTS


class _Encoded:
    """Each demonstration's `prompt + completion + EOS` ids and labels (−100 on the prompt; a multi-turn one goes
    on with observation, action + EOS, …, observations −100 too, each encoded as the rollout loop does: module
    docstring), tokenized the first time a step draws it: a step re-tokenizing its batch spent about 40% of the
    warm-up in the tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, demos: list[Demonstration]) -> None:
        self.tokenizer, self.demos = tokenizer, demos
        self._rows: dict[int, tuple[Tensor, Tensor]] = {}

    def row(self, i: int) -> tuple[Tensor, Tensor]:
        if i not in self._rows:
            from rlvr.chat.observation import encode_observation
            from rlvr.chat.tools import tool_prompt_ids

            d, tokenizer = self.demos[i], self.tokenizer
            ids = (tool_prompt_ids(tokenizer, d.prompt, d.prompt.schemas) if isinstance(d.prompt, ToolPrompt)
                   else encode_prompts(tokenizer, [d.prompt])[0])
            labels = [-100] * len(ids)
            for k, text in enumerate((d.completion, *d.followups)):
                if k % 2 == 0:  # an action, ended by EOS, supervised
                    piece = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                else:
                    piece = encode_observation(tokenizer, text, ids, text.results if isinstance(text, ToolTurn)
                                               else None)
                ids, labels = ids + piece, labels + (piece if k % 2 == 0 else [-100] * len(piece))
            self._rows[i] = (torch.tensor(ids), torch.tensor(labels))
        return self._rows[i]

    def batch(self, indices: list[int], device: Device) -> tuple[Tensor, Tensor, Tensor]:
        """Right-padded ids, labels (−100 on prompt and padding) and attention mask of demonstrations `indices`."""
        rows = [self.row(i) for i in indices]
        pad_sequence = torch.nn.utils.rnn.pad_sequence
        ids = pad_sequence([r for r, _ in rows], batch_first=True, padding_value=self.tokenizer.pad_token_id)
        labels = pad_sequence([lab for _, lab in rows], batch_first=True, padding_value=-100)
        lengths = torch.tensor([len(r) for r, _ in rows])
        attn = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        return ids.to(device), labels.to(device), attn.to(device)
