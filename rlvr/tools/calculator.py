"""A calculator tool: integer arithmetic on an expression, evaluated from its syntax tree (never `eval`)."""

from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}
_MAX_DIGITS = 100  # a result this long is a runaway (9**9**9), refused before it is computed further


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Integers with + - * / // % and parentheses, e.g. "123 + 456".
    """
    return str(_value(ast.parse(expression, mode="eval").body))


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value) if isinstance(node.value, float) else int(node.value)  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        value = _OPS[type(node.op)](_value(node.left), _value(node.right))
        if isinstance(value, int) and len(str(abs(value))) > _MAX_DIGITS:
            raise ValueError(f"a result of more than {_MAX_DIGITS} digits")
        return value
    raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")
