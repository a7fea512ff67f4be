"""Which observation ids are the text's own (rlvr/rollout/observation_body.py): against Qwen2.5's, Qwen3-2507's and
Llama 3's chat template texts (offline tokenizers of tests/chat/test_chat_turns.py) and model=tiny's (no template)."""

import pytest
from chat.test_chat_turns import llama3, qwen, qwen3_2507, text

from rlvr.chat.observation import encode_observation
from rlvr.model.tiny import TinyLlama
from rlvr.rollout.observation_body import observation_body


def flags(tok, text_or_results, row):
    """(ids, body flags) of an observation (a str) or of an action's tool results (a list), as episodes mark them."""
    results = text_or_results if isinstance(text_or_results, list) else None
    ids = encode_observation(tok, "" if results else text_or_results, row, results)
    empty = encode_observation(tok, "", row, None if results is None else [""] * len(results))
    return ids, observation_body(ids, empty)


def test_the_body_is_what_the_empty_encoding_does_not_match():
    # [h h B B s] against [h h s] → the two B; [h B s B s] against [h s s] → both B (the template between them not)
    assert observation_body([7, 8, 1, 2, 9], [7, 8, 9]) == [False, False, True, True, False]
    assert observation_body([7, 1, 9, 2, 9], [7, 9, 9]) == [False, True, False, True, False]
    assert observation_body([7, 8, 9], [7, 8, 9]) == [False] * 3 and observation_body([4, 5], []) == [True, True]


@pytest.mark.parametrize(("build", "body"), [(qwen, "Too low."), (qwen3_2507, "Too low."), (llama3, "Too low.")],
                         ids=["qwen2.5", "qwen3-2507", "llama3"])
@pytest.mark.parametrize("closed", [True, False], ids=["action-ended-the-turn", "action-cut"])
def test_the_body_is_the_observation_text_and_the_template_tokens_are_not(build, body, closed):
    tok = build()
    eot = tok.convert_tokens_to_ids("<|im_end|>" if build is not llama3 else "<|eot_id|>")
    row = [5, eot] if closed else [5]  # a cut action: the end of turn leads the observation's ids
    ids, flags_ = flags(tok, body, row)
    assert len(flags_) == len(ids) and flags_[0] is False  # a newline or header token opens the suffix
    assert text(tok, [i for i, f in zip(ids, flags_, strict=True) if f]) == body
    template = text(tok, [i for i, f in zip(ids, flags_, strict=True) if not f])
    if build is llama3:
        assert template == ("" if closed else "<|eot_id|>") + ("<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
                                                                "<|start_header_id|>assistant<|end_header_id|>\n\n")
    else:
        assert template == ("" if closed else "<|im_end|>") + "\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"


def test_llama3_trims_the_text_and_its_trimmed_tokens_are_the_body():
    tok = llama3()
    ids, flags_ = flags(tok, " Too high.\n", [5, tok.convert_tokens_to_ids("<|eot_id|>")])
    assert text(tok, [i for i, f in zip(ids, flags_, strict=True) if f]) == "Too high."


def test_tool_results_are_the_body_and_the_tool_turn_template_is_not():
    tok = qwen()
    ids, flags_ = flags(tok, ["Too low.", "Correct!"], [5, tok.convert_tokens_to_ids("<|im_end|>")])
    # Qwen's pre-tokenizer merges "." and "!" with the template's newline after them (".\n"): such a boundary token
    # counts as body (the module docstring)
    assert text(tok, [i for i, f in zip(ids, flags_, strict=True) if f]) == "Too low.\nCorrect!\n"
    assert text(tok, [i for i, f in zip(ids, flags_, strict=True) if not f]) == (
        "\n<|im_start|>user\n<tool_response>\n</tool_response>\n<tool_response>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_without_a_chat_template_every_id_is_the_body():
    _, tok = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None).load(0)
    assert not getattr(tok, "chat_template", None)
    ids, flags_ = flags(tok, "+", [3])
    assert flags_ == [True] * len(ids) and ids
