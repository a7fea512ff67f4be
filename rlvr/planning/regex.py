"""Strategic-gram planning detector: a token is "planning" when it is part of a phrase such as "let me check"
(retrain's `planning = "regex"`, docs/algorithms.md#planning-tokens; HICRA, arXiv 2509.03646, names these
strategic grams).

Input: one completion's tokens as the tokenizer's raw pieces — `tokenizer.convert_ids_to_tokens(ids)`
— in order, one string per completion token (per-token decoded strings, `tokenizer.decode([id])`, work
too). Output: one 0/1 per token (`detect`), or a bool [P·G, T] tensor for a whole step (`mask`).

Algorithm:
  1. Each piece is turned into the text it stands for: the word-start markers `▁` (SentencePiece) and
     `Ġ` (byte-level BPE) become a space, byte-level `Ċ`/`ĉ` and SentencePiece `<0x0A>`/`<0x09>` become
     newline/tab, the byte-level right single quote `âĢĻ` (and a literal `’`) become `'`. Other
     characters are kept, so a piece's text has a known character span in the completion's text.
  2. The pieces' texts are concatenated (no separators) into the completion's text.
  3. One case-insensitive regex, the alternation of `\\b<gram>\\b` where the words of a gram are joined
     by `\\s+` (any run of whitespace, newlines included), is searched at *every* start position
     (overlapping occurrences, e.g. "wait let me think" contains two grams, are all found; of grams
     matching at the same position the longest is taken, and it covers the shorter ones).
  4. Every token whose character span overlaps a match is marked 1 — all the tokens a multi-token gram
     covers, and only those.

`grams`: None → the 18 `DEFAULT_STRATEGIC_GRAMS`; otherwise the given list (blank entries dropped,
surrounding whitespace stripped); an empty list marks nothing. A gram that begins or ends with a
non-word character needs a word character beside it to satisfy `\\b`, as in retrain.

Deliberate deviations from retrain's detector (which stripped each piece, joined the pieces with single
spaces, and for every start token marked from that start through the first token at which a window of
max(5, longest gram) tokens matched):
  * retrain also marked tokens *before* the gram inside the window (e.g. "so" in "so let me check",
    whenever the gram ends within the window that starts at "so"); here only covered tokens are marked.
  * retrain joined sub-word pieces with spaces, so a gram word split into several tokens ("dou"+"ble")
    never matched; here it does.
  * retrain could not match across a newline piece (`Ċ` was not cleaned) and needed the gram within a
    window of tokens; here whitespace runs match `\\s+` and there is no token window.
Non-ASCII characters of byte-level pieces other than `’` stay in the byte alphabet; the default grams
are ASCII, so this only matters for custom non-ASCII grams.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


DEFAULT_STRATEGIC_GRAMS: tuple[str, ...] = (
    "wait let me",
    "let me think",
    "on second thought",
    "let me check",
    "let me verify",
    "is this right",
    "double check",
    "try another approach",
    "go back and",
    "start over",
    "that's not right",
    "that doesn't work",
    "another way to",
    "or we could",
    "what if we",
    "notice that",
    "the key is",
    "the key insight",
)

_PIECE_REPLACEMENTS = (("âĢĻ", "'"), ("<0x0A>", "\n"), ("<0x09>", "\t"))
_PIECE_CHARS = str.maketrans({"\u2581": " ", "\u0120": " ", "\u010a": "\n", "\u0109": "\t", "\u2019": "'"})


def piece_text(piece: str) -> str:
    """The text a tokenizer piece stands for (step 1 of the module docstring)."""
    for marker, text in _PIECE_REPLACEMENTS:
        if marker in piece:
            piece = piece.replace(marker, text)
    return piece.translate(_PIECE_CHARS)


class RegexPlanningDetector:
    """`RegexPlanningDetector(grams=None)`: see the module docstring."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"planning_mask"}))

    def __init__(self, grams: Sequence[str] | None = None) -> None:
        if isinstance(grams, str):
            raise TypeError(f"grams must be a list of phrases, got the string {grams!r}")
        chosen = DEFAULT_STRATEGIC_GRAMS if grams is None else grams
        self.grams: tuple[str, ...] = tuple(g.strip() for g in chosen if g.strip())
        # longest first: of the grams matching at one position the longest wins; its span covers the others
        by_length = sorted(self.grams, key=len, reverse=True)
        alternatives = (r"\s+".join(re.escape(word) for word in gram.split()) for gram in by_length)
        self._pattern = (
            re.compile(r"(?=(\b(?:" + "|".join(alternatives) + r")\b))", re.IGNORECASE)
            if self.grams
            else None
        )

    def detect(self, token_strs: Sequence[str]) -> list[int]:
        """0/1 per token of one completion."""
        marks = [0] * len(token_strs)
        if self._pattern is None or not token_strs:
            return marks
        texts = [piece_text(piece) for piece in token_strs]
        ends = list(accumulate(len(t) for t in texts))
        starts = [end - len(t) for end, t in zip(ends, texts, strict=True)]
        depth = [0] * (len(texts) + 1)  # difference array over token indices
        for match in self._pattern.finditer("".join(texts)):
            begin, end = match.span(1)
            first = bisect.bisect_right(ends, begin)  # first token ending after the match begins
            last = bisect.bisect_left(starts, end) - 1  # last token starting before the match ends
            if first <= last:
                depth[first] += 1
                depth[last + 1] -= 1
        running = 0
        for i in range(len(marks)):
            running += depth[i]
            marks[i] = int(running > 0)
        return marks

    def mask(self, token_strings_PG: Sequence[Sequence[str]], length: int) -> Tensor:
        """bool [rows, length]: row r marks completion r's planning tokens, False past its end.

        `token_strings_PG[r]` are completion r's pieces (the rows of the step, prompt-major); `length` is
        the padded T of the step's tensors."""
        mask_PG_T = torch.zeros(len(token_strings_PG), length, dtype=torch.bool)
        for row, token_strs in enumerate(token_strings_PG):
            if len(token_strs) > length:
                raise ValueError(f"completion {row} has {len(token_strs)} tokens, more than length={length}")
            marks = self.detect(token_strs)
            if any(marks):
                mask_PG_T[row, : len(marks)] = torch.tensor(marks, dtype=torch.bool)
        return mask_PG_T
