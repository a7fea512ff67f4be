"""Tools in multi-turn episodes: a callable's JSON schema (schema.py), the policy's Hermes tool calls
(parse.py), each call run bounded (run.py), and the harness that wraps any environment's episodes with them
(harness.py). The prompt and tool-turn ids under the model's chat template are rlvr/chat/tools.py's."""

TOOL_KEYS = ("tools", "max_tool_calls", "tool_timeout_s", "tool_output_chars", "tool_call_format", "tool_call_marker")
"""The `env` keys the tool harness reads (rlvr/tools/harness.py); the wrapped environment's constructor never sees
them."""
