"""A tool: a Python callable and its JSON schema, built from `env.tools` entries.

The schema is transformers' `get_json_schema` (the one `apply_chat_template(tools=[fn])` and TRL's
`GRPOTrainer(tools=)` use): the function's name, the first paragraph of its docstring, and each parameter's
JSON type from its annotation and its description from the Google-style `Args:` section, e.g.

    def calculate(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: Integers, + - * / and parentheses, e.g. "123 + 456".
        '''
    → {"type": "function", "function": {"name": "calculate", "description": "Evaluate an arithmetic expression.",
       "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": …}},
                      "required": ["expression"]}, "return": {"type": "string"}}}

A parameter without a type hint or without an `Args:` line is refused (transformers raises); the refusal is a
ConfigError naming the entry. An `env.tools` entry is `{_target_: module.function, **bound}`: the function
itself, not called (Hydra's instantiate would call it), with any other keys bound as keyword arguments
(`functools.partial`) and left out of the schema, so a tool's settings live in YAML and the policy sees only
what it may choose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from rlvr.errors import ConfigError
from rlvr.types import Tool


def tool_schema(fn: Callable[..., Any]) -> dict:
    """`get_json_schema(fn)`; for a `functools.partial`, its function's schema less the bound parameters."""
    from transformers.utils import get_json_schema

    if not isinstance(fn, functools.partial):
        return get_json_schema(fn)
    schema = get_json_schema(fn.func)
    parameters = schema["function"]["parameters"]
    for name in fn.keywords:
        parameters.get("properties", {}).pop(name, None)
    if "required" in parameters:
        parameters["required"] = [p for p in parameters["required"] if p not in fn.keywords]
    return schema


def build_tools(entries: list[Mapping[str, Any]]) -> list[Tool]:
    """The tools of `env.tools` (module docstring); ConfigError for an entry without `_target_`, one that does
    not import, one without a schema, or two tools of one name."""
    from hydra.utils import get_object

    tools: list[Tool] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or "_target_" not in entry:
            raise ConfigError(f"invalid config:\n  env.tools[{i}]={entry!r} must be a mapping with a _target_ "
                              "(a function: module.name)")
        target = str(entry["_target_"])
        try:
            fn = get_object(target)
        except Exception as err:  # noqa: BLE001 - any import failure is a config error
            raise ConfigError(f"invalid config:\n  env.tools[{i}]._target_={target!r} cannot be imported: {err}"
                              ) from err
        if not callable(fn) or isinstance(fn, type):
            raise ConfigError(f"invalid config:\n  env.tools[{i}]._target_={target!r} is not a function")
        bound = {k: v for k, v in entry.items() if not str(k).startswith("_")}
        tool = functools.partial(fn, **bound) if bound else fn
        try:
            schema = tool_schema(tool)
        except Exception as err:  # noqa: BLE001 - transformers' DocstringParsingException, TypeHintParsingException
            raise ConfigError(f"invalid config:\n  env.tools[{i}] <{target}> has no JSON schema: {err} (a tool "
                              "needs a type hint and a Google-style `Args:` line for every parameter)") from err
        name = schema["function"]["name"]
        if any(t.name == name for t in tools):
            raise ConfigError(f"invalid config:\n  env.tools: two tools are named {name!r}")
        tools.append(Tool(name, tool, schema))
    return tools
