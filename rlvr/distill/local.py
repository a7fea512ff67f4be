"""`distill=teacher`: a frozen teacher loaded into this process from a local checkpoint.

`distill.teacher.path` is one of

    an rlvr run folder (or its checkpoints/step_N)   its base (<run>/base/) with the checkpoint's weights: the LoRA
                                                      adapter merged in, or the full weights (as `rlvr export` does)
    a Hugging Face model folder or hub id            `AutoModelForCausalLM.from_pretrained` (an `rlvr export`
                                                      folder is one), read from the local cache when offline

The teacher runs in eval mode under no_grad, in float32 unless `dtype` says otherwise, on the policy's device,
`batch_rows` rows per forward pass: each row is its prompt then the student's completion, right-padded (a causal
model's real positions never see the padding after them), and log π_teacher(y_t) is the log-softmax of the
untempered logits at the position before token t. The teacher's tokenizer must equal the student's (the same
vocabulary: token → id), or `distill.token_map` must map one onto the other (rlvr/distill/distill.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.backend.logprobs import score_rows
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.protocols import Finding, Needs
from rlvr.requirements import hub_offline
from rlvr.types import TeacherScores

if TYPE_CHECKING:
    from torch import Tensor, nn

torch = lazy_import("torch")


class LocalTeacher:
    whole_vocabulary = True
    """It has every logit at hand: distill.estimator=full may take its whole vocabulary as the support (topk=0)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """The teacher's files are on this machine (`TeacherFiles`, checked in a run's first second and by `rlvr
        doctor`); a run then loads them at start."""
        return Needs(machine=(TeacherFiles(str(settings.get("path"))),))

    @classmethod
    def memory(cls, settings: Mapping[str, Any]) -> str:
        """`rlvr plan`'s line: the weights beside the policy (their files' size when on this machine), a pass a step."""
        from rlvr.algorithm.kl import DTYPE_BYTES, weight_file_bytes

        path, dtype = str(settings.get("path")), str(settings.get("dtype", "float32"))
        size = weight_file_bytes(str(Path(path) / "base")) or weight_file_bytes(path)
        what = (f"{size / 2**20:.3g} MiB (its files)" if size is not None else
                f"its parameter count × {DTYPE_BYTES.get(dtype, 4)} bytes")
        return (f"distillation teacher ({path}): {what} in {dtype} beside the policy, and one no-grad forward pass "
                "over the step's rows each step")

    def __init__(self, *, path: str, dtype: str = "float32", batch_rows: int = 64) -> None:
        if not path or str(path).startswith("???"):
            raise ConfigError("distill.teacher.path is not set: give an rlvr run folder, its export, or a "
                              "transformers model (a folder or a hub id)")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"distill.teacher.dtype={dtype!r}: expected float32, bfloat16 or float16")
        if batch_rows < 1:
            raise ConfigError(f"distill.teacher.batch_rows={batch_rows}: expected >= 1")
        self.path, self.dtype, self.batch_rows = str(path), dtype, batch_rows
        self.model: nn.Module | None = None
        self.tokenizer: Any = None
        self.origin = ""

    def describe(self) -> str:
        return f"local {self.origin or self.path}"

    def load(self, device: Any = "cpu") -> None:
        """The weights and the tokenizer, once (the first `score` loads them otherwise)."""
        if self.model is not None:
            return
        model, self.tokenizer, self.origin = load_teacher(Path(self.path), self.path)
        self.model = model.to(device=device, dtype=getattr(torch, self.dtype)).eval().requires_grad_(False)

    def vocabulary_check(self, student_tokenizer: Any) -> str | None:
        """None when the teacher's tokenizer maps every token to the student's id; else the first difference."""
        self.load()
        return vocabulary_difference(student_tokenizer.get_vocab(), self.tokenizer.get_vocab())

    def score(self, prompts: Sequence[Sequence[int]], completions_N_T: Tensor, lengths: Sequence[int], topk: int = 0
              ) -> TeacherScores:
        self.load()
        assert self.model is not None
        return score_rows(self.model, prompts, completions_N_T, lengths, topk, self.batch_rows)


def load_teacher(path: Path, given: str) -> tuple[Any, Any, str]:
    """(module, tokenizer, where it came from) for an rlvr run folder or checkpoint, or a transformers model."""
    from rlvr.checkpoint import STATE_FILE

    if path.is_dir() and ((path / "checkpoints").is_dir() or (path / STATE_FILE).is_file()):
        from rlvr.errors import CliError
        from rlvr.run_weights import FULL_WEIGHTS, find_checkpoint, full, load_run_base, merged, quiet_progress_bars

        quiet_progress_bars()
        try:
            run, checkpoint = find_checkpoint(path)
            module, tokenizer = load_run_base(run)
            if (checkpoint / FULL_WEIGHTS).is_file():
                return full(module, checkpoint), tokenizer, f"{checkpoint} (full weights)"
            model, detail = merged(module, checkpoint)
            return model, tokenizer, f"{checkpoint} ({detail})"
        except CliError as err:
            raise ConfigError(f"distill.teacher.path={given}: {err}") from None
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(given)
        tokenizer = transformers.AutoTokenizer.from_pretrained(given)
    except OSError as err:
        raise ConfigError(f"distill.teacher.path={given}: neither an rlvr run folder (with checkpoints/) nor a "
                          f"model transformers can load ({str(err).splitlines()[0]})") from None
    return model, tokenizer, given


def vocabulary_difference(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    """The first token whose id differs between two vocabularies (token → id), or that one of them lacks."""
    if student == teacher:
        return None
    for token, i in sorted(student.items(), key=lambda kv: kv[1]):
        if teacher.get(token) != i:
            return f"the student's token {token!r} is id {i}, the teacher's {teacher.get(token, 'absent')}"
    extra = sorted(set(teacher) - set(student))
    return f"the teacher has {len(extra)} tokens the student lacks (first {extra[0]!r})"


@dataclass(frozen=True)
class TeacherFiles:
    """`distill.teacher.path` names weights this machine has: an rlvr run folder with a complete checkpoint and its
    `base/`, a model folder with its config.json, or a hub id in the local cache (else downloaded at start, unless
    offline). Files only: nothing is loaded."""

    path: str
    item: str = "teacher"
    at_start: bool = True

    def check(self) -> Finding:
        from rlvr.algorithm.kl import weight_file_bytes
        from rlvr.checkpoint import STATE_FILE

        key, folder = f"distill.teacher.path={self.path}", Path(self.path)
        if folder.is_dir() and ((folder / "checkpoints").is_dir() or (folder / STATE_FILE).is_file()):
            run = folder if (folder / "checkpoints").is_dir() else folder.parent.parent
            saved = [p for p in (run / "checkpoints").glob("step_*") if (p / STATE_FILE).is_file()]
            if not saved or not (run / "base" / "base.json").is_file():
                return Finding("missing", f"{key}: an rlvr run folder needs a complete checkpoint "
                                          f"(checkpoints/step_N/{STATE_FILE}) and its base/ (base/base.json)")
            return Finding("ok", f"{key}: an rlvr run folder, {len(saved)} checkpoint(s)")
        if folder.is_dir():
            found = (folder / "config.json").is_file()
            return Finding("ok" if found else "missing", f"{key}: a model folder" if found else
                           f"{key}: a folder without config.json (not a transformers model, nor an rlvr run folder)")
        if weight_file_bytes(self.path) is not None:
            return Finding("ok", f"{key}: in the local hub cache")
        offline = hub_offline()
        if offline:
            return Finding("missing", f"{key}: no such folder, and not in the local hub cache ({offline})")
        return Finding("warning", f"{key}: not in the local hub cache: the run downloads it at start")
