"""Observation ids of chat templates (rlvr/chat/turns.py), on real templates with offline tokenizers.

No chat tokenizer is cached here and tests never download, so each test builds a byte-level BPE tokenizer
(Qwen2's pre-tokenizer regex, merges trained on a few sentences) with the model's special tokens, and sets
the model's chat template text: Qwen2.5-Instruct's, Qwen3's (hybrid thinking) and Meta-Llama-3-Instruct's.
The templates are copied verbatim (Qwen3-Instruct-2507's less its tools branch), long lines included.
"""
# ruff: noqa: E501

import pytest

from rlvr.chat.check import check_chat_turns
from rlvr.chat.turns import end_of_turn_id, observation_ids
from rlvr.errors import ConfigError
from rlvr.model.prompt_encoding import chat_ids, encode_prompts, eos_ids

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

QWEN2_5 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Qwen3-Instruct-2507's template (conf/model/qwen3_4b.yaml's model) without its tools branch: no <think> handling
QWEN3_2507 = r"""{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == "
    "0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# ChatML that drops the reasoning of every past assistant message (as QwQ's and DeepSeek-R1's templates do)
STRIPS_THINKING = (
    "{% for m in messages %}{% set content = m.content %}"
    "{% if m.role == 'assistant' and '</think>' in content %}{% set content = content.split('</think>')[-1]"
    ".lstrip('\\n') %}{% endif %}<|im_start|>{{ m.role }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# ChatML that decorates only the last user message: adding a turn rewrites the previous one
DECORATES_LAST_USER = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if loop.last and m.role == 'user' %} Answer briefly.{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\nuser\nassistant\nsystem\n",
          "Guess a number from 1 to 9. My guess is 5. Too low. Too high. Correct!\n\n It is above 5.\n"]


def build_tokenizer(template: str, special: list[str], eos: str, bos: str | None = None,
                    thinking_tokens: bool = True):
    """A byte-level BPE tokenizer in Qwen2's shape: `special` are special added tokens (never split),
    <think>/</think> plain added tokens as in Qwen3's vocabulary."""
    pre = tokenizers.pre_tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = pre.Sequence([pre.Split(tokenizers.Regex(QWEN_SPLIT), behavior="isolated"),
                                      pre.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=special, show_progress=False,
                                             initial_alphabet=pre.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos,
                                                pad_token=special[0])
    if thinking_tokens:
        fast.add_tokens(["<think>", "</think>"])
    fast.chat_template = template
    return fast


def qwen(template: str = QWEN2_5):
    return build_tokenizer(template, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos="<|im_end|>")


def qwen3_2507():
    return qwen(QWEN3_2507)


def llama3():
    special = ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    return build_tokenizer(LLAMA3, special, eos="<|eot_id|>", bos="<|begin_of_text|>", thinking_tokens=False)


def text(tok, ids: list[int]) -> str:
    return tok.decode(ids, clean_up_tokenization_spaces=False)


def test_qwen2_5_suffix_is_newline_user_message_and_generation_prompt():
    tok = qwen()
    # the model stops at <|im_end|>; the newline after it is the template's, so it opens the suffix
    assert end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|im_end|>")
    ids = observation_ids(tok, "Too low.")
    assert text(tok, ids) == "\n<|im_start|>user\nToo low.<|im_end|>\n<|im_start|>assistant\n"
    assert text(tok, observation_ids(tok, "")) == "\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    # Qwen3-Instruct-2507 adds the same (it has no default system prompt, which only the first render carries)
    assert observation_ids(qwen3_2507(), "Too low.") == ids


def test_llama3_suffix_has_no_newline_and_trims_the_observation():
    tok = llama3()
    assert end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|eot_id|>")
    assert text(tok, observation_ids(tok, " Too low.\n")) == ("<|start_header_id|>user<|end_header_id|>\n\nToo low."
                                                             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


# Llama 3's template behind a system block that prints today's date, as Llama 3.1–3.3's do ("Today Date: " +
# strftime_now("%d %b %Y"))
DATED = (
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: {{ strftime_now('%d %b %Y') }}\n\n<|eot_id|>{% for message in messages %}<|start_header_id|>"
    "{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_a_template_that_prints_todays_date_renders_the_same_prompt_on_any_day(monkeypatch):
    """transformers gives templates `strftime_now` (the machine's clock); rlvr renders every template with the date
    pinned (rlvr/model/prompt_encoding.py TEMPLATE_DATE), so the prompt ids of a run, its resume and a campaign's
    next seed do not change with the day. The clock is moved to 2 Jan 2031 here: transformers' own render follows it,
    rlvr's prompt, episode turns and tools do not."""
    import datetime

    import transformers.utils.chat_template_utils as templates

    special = ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = build_tokenizer(DATED, special, eos="<|eot_id|>", bos="<|begin_of_text|>", thinking_tokens=False)
    before = encode_prompts(tok, ["Guess a number from 1 to 9."])[0]
    turn = observation_ids(tok, "Too low.")

    class Later(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2031, 1, 2)

    monkeypatch.setattr(templates, "datetime", Later)
    messages = [{"role": "user", "content": "Guess a number from 1 to 9."}]
    assert "Today Date: 02 Jan 2031" in tok.apply_chat_template(messages, tokenize=False)  # the clock, unpinned
    assert encode_prompts(tok, ["Guess a number from 1 to 9."])[0] == before
    assert "Today Date: 26 Jul 2024\n" in text(tok, before) and observation_ids(tok, "Too low.") == turn
    assert check_chat_turns(tok, "meta-llama/Llama-3.1-8B-Instruct", stop_ids=[end_of_turn_id(tok)]) is None


@pytest.mark.parametrize("build", [qwen, qwen3_2507, llama3], ids=["qwen2.5", "qwen3-2507", "llama3"])
def test_context_plus_action_plus_observation_ids_is_the_render_for_three_turns(build):
    tok = build()
    eot = end_of_turn_id(tok)
    users = ["Guess a number from 1 to 9.", "Too low.", "Too high.", "Correct!"]
    actions = ["My guess is 5.", "<think>\nIt is above 5.\n</think>\n\nMy guess is 8.", "My guess is 7."]
    messages = [{"role": "user", "content": users[0]}]
    context = encode_prompts(tok, [users[0]])[0]  # how episodes encode the first observation
    for action, observation in zip(actions, users[1:], strict=True):
        context = context + tok.encode(action, add_special_tokens=False) + [eot] + observation_ids(tok, observation)
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
        assert context == chat_ids(tok, messages)
    assert len(messages) == 7  # 3 actions, each followed by an observation


@pytest.mark.parametrize("build", [qwen, qwen3_2507, llama3], ids=["qwen2.5", "qwen3-2507", "llama3"])
def test_prefix_preserving_templates_pass_with_the_engine_stop_ids(build):
    tok = build()
    assert check_chat_turns(tok, "some/model", stop_ids=eos_ids(tok, [tok.eos_token_id, tok.pad_token_id])) is None


def test_qwen3_template_is_said_to_rewrite_naming_the_model_and_the_dropped_think_block():
    tok = qwen(QWEN3)
    # the first prompt ends with an empty <think></think> (enable_thinking=False) that a past turn no longer shows;
    # not refused: its episodes' rows split there (rlvr/chat/rewrites.py)
    rewrite = check_chat_turns(tok, "Qwen/Qwen3-0.6B")
    assert rewrite is not None and "'Qwen/Qwen3-0.6B'" in rewrite
    assert "adding turn 2 rewrites turn 1's context" in rewrite
    assert "<think>\\n\\n</think>" in rewrite
    # its observation suffix is still what follows the assistant turn's <|im_end|>: the user message and the
    # generation prompt with its empty <think> block
    assert text(tok, observation_ids(tok, "Too low.")) == ("\n<|im_start|>user\nToo low.<|im_end|>\n<|im_start|>"
                                                          "assistant\n<think>\n\n</think>\n\n")


def test_template_stripping_past_reasoning_is_said_to_rewrite_the_action():
    tok = qwen(STRIPS_THINKING)
    assert observation_ids(tok, "Too low.") == observation_ids(qwen(), "Too low.")  # its suffix is plain ChatML
    assert "turn 2's action as 'My guess is 7.'" in check_chat_turns(tok, "org/qwq")


def test_template_rewriting_the_last_user_message_is_said_to_rewrite_the_context():
    rewrite = check_chat_turns(qwen(DECORATES_LAST_USER), "org/brief")
    assert "rewrites turn 1's context" in rewrite and "Answer b" in rewrite


def test_end_of_turn_the_engine_does_not_stop_at_is_refused():
    tok = qwen()
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    with pytest.raises(ConfigError, match=r"'org/base'.*'<\|im_end\|>'.*engine stops at ids \[0\]"):
        check_chat_turns(tok, "org/base", stop_ids=[endoftext])


def test_template_without_a_special_end_of_turn_is_refused():
    plain = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
             "{% if add_generation_prompt %}assistant:{% endif %}")
    with pytest.raises(ConfigError, match=r"'org/plain'.*no special token closes the assistant turn"):
        check_chat_turns(qwen(plain), "org/plain")


def test_a_changed_template_is_not_served_from_the_cache():
    tok = qwen()
    before = observation_ids(tok, "Too low.")
    tok.chat_template = DECORATES_LAST_USER
    assert observation_ids(tok, "Too low.") != before
    assert text(tok, observation_ids(tok, "Too low.")).startswith("\n<|im_start|>user\nToo low. Answer briefly.")
