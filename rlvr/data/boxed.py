r"""The answer inside the last `\boxed{...}` of a text (the predecessor's `extract_boxed` rule).

Rule: find the **last** occurrence of the literal `\boxed{`; scan from just after it with brace depth 1,
`{` adding one and `}` taking one, until the depth returns to 0; the answer is the text in between,
stripped.

Edge cases:
- No `\boxed{` in the text, or only whitespace inside it (`\boxed{}`) → `""`.
- Unbalanced braces (the depth never returns to 0) → everything after `\boxed{` to the end, stripped.
- Only the literal `\boxed{` counts: `\boxed 5`, `\boxed {5}` and `\fbox{5}` are not answers.
- Escaped braces (`\{`, `\}`) are counted like plain ones, as in the predecessor.
"""

from __future__ import annotations

import re

MARKER = "\\boxed{"
_BRACE = re.compile(r"[{}]")  # the scan jumps from brace to brace: a megabyte without braces costs ~1 ms, not 0.1 s


def extract_boxed(text: str) -> str:
    """Content of the last `\\boxed{...}` in `text`, stripped; "" when there is none."""
    start = text.rfind(MARKER)
    if start < 0:
        return ""
    start += len(MARKER)
    depth = 1
    for brace in _BRACE.finditer(text, start):
        if brace.group() == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return text[start:brace.start()].strip()
    return text[start:].strip()
