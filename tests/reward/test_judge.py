"""`reward=judge` against a loopback OpenAI-compatible server (tests/openai_compatible_server.py): no real
endpoint is reachable here, and none is needed to check what is sent and how every reply is counted."""

import inspect
import json
import time

import pytest
from openai_compatible_server import OpenAICompatibleServer, chat_judge, conf_values

from rlvr.errors import ConfigError
from rlvr.reward.guarded import guarded_score
from rlvr.reward.judge import ChatJudge

KEY = "sk-fake-judge-0123456789abcdef"
PROMPT = conf_values("reward/judge")["prompt"]


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAICompatibleServer(api_key=KEY) as fake:
        yield fake


def judge(server, **kwargs) -> ChatJudge:
    """conf/reward/judge.yaml's judge on `server`, quicker to give up (the loopback server answers at once)."""
    return chat_judge(base_url=server.base_url, **{"timeout_s": 5.0, "backoff_s": 0.01, **kwargs})


def test_verdicts_and_the_request_as_configured(server):
    reward = judge(server, model="judge-model", max_tokens=5, system="Be strict.")
    scores = reward.score(["so the answer is 42", "I think 41", "42"], ["42", "42", "42"])
    assert scores == type(scores)([1.0, 0.0, 1.0])
    assert len(server.requests) == 3
    for request in server.requests:
        assert request["path"] == "/v1/chat/completions"
        assert request["headers"]["Authorization"] == f"Bearer {KEY}"
        assert request["headers"]["Content-Type"] == "application/json"
    users = sorted(body["messages"][1]["content"] for body in server.bodies())
    assert users == sorted(PROMPT.format(completion=c, reference="42") for c in ["so the answer is 42", "I think 41",
                                                                                  "42"])
    for body in server.bodies():
        assert body["model"] == "judge-model" and body["temperature"] == 0 and body["max_tokens"] == 5
        assert body["messages"][0] == {"role": "system", "content": "Be strict."}
        assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_a_custom_template_and_no_system_message(server):
    reward = judge(server, system=None, prompt="<reference>{reference}</reference> vs <response>{completion}</response>"
                                               " {{literal}}")
    assert reward.score(["x=7"], ["7"]).values == [1.0]
    (body,) = server.bodies()
    assert body["messages"] == [{"role": "user", "content": "<reference>7</reference> vs <response>x=7</response> "
                                                            "{literal}"}]


@pytest.mark.parametrize("reply, value, parse_failures", [
    ("YES", 1.0, 0), ("Yes, it matches.", 1.0, 0), ("no", 0.0, 0), ("No, not yes.", 0.0, 0),
    ("Eyes on the nose: yes", 1.0, 0), ("The answer is correct.", 0.0, 1), ("", 0.0, 1), ("noyes", 0.0, 1),
])
def test_the_first_whole_word_yes_or_no_decides(server, reply, value, parse_failures):
    scores = judge(server).score([f"[[reply:{reply}]]"], ["1"])
    assert (scores.values, scores.parse_failures, scores.errors, scores.timeouts) == ([value], parse_failures, 0, 0)


def test_every_failure_kind_scores_zero_and_is_counted(server, caplog):
    completions = ["42", "[[status:500:2]] 42", "[[status:429:1]] 42", "[[status:503]] 42", "[[status:401]] 42",
                   "[[status:400]] 42", "[[malformed]]", "[[no-choices]]", "[[reply:maybe]]", "[[sleep:3]] 42"]
    scores = judge(server, retries=2, timeout_s=0.5).score(completions, ["42"] * len(completions))
    #            ok   500×2 then ok  429 then ok   503 ×3  401  400  bad JSON  no choices  maybe  too slow
    assert scores.values == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert (scores.errors, scores.timeouts, scores.parse_failures) == (5, 1, 1)
    sent = [b["messages"][-1]["content"] for b in server.bodies()]
    attempts = {c: sum(f"<response>\n{c}\n</response>" in u for u in sent) for c in completions}
    assert attempts == {"42": 1, "[[status:500:2]] 42": 3, "[[status:429:1]] 42": 2, "[[status:503]] 42": 3,
                        "[[status:401]] 42": 1, "[[status:400]] 42": 1, "[[malformed]]": 1, "[[no-choices]]": 1,
                        "[[reply:maybe]]": 1, "[[sleep:3]] 42": 3}  # 4xx other than 429: not retried
    (warning,) = [r for r in caplog.records if r.name == "rlvr"]
    assert "7 of 10 completions scored 0.0 unjudged (1 timed out, 5 errors, 1 verdicts neither yes nor no)" \
        in warning.getMessage()
    assert KEY not in caplog.text


def test_a_slow_item_bounds_the_batch_and_the_rest_are_judged(server):
    reward = judge(server, timeout_s=0.4, retries=1, backoff_s=0.05)
    start = time.monotonic()
    scores = reward.score(["[[sleep:30]]"] + [f"{i}" for i in range(8)], ["1"] + [f"{i}" for i in range(8)])
    elapsed = time.monotonic() - start
    assert scores.values == [0.0] + [1.0] * 8 and scores.timeouts == 1
    assert elapsed < 0.4 * 2 + 0.05 + 1.5, elapsed  # timeout_s × (retries + 1) + backoff + slack


def test_concurrency_never_exceeds_max_concurrency(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAICompatibleServer(hold_s=0.2) as server:
        scores = judge(server, max_concurrency=3).score([str(i) for i in range(12)], [str(i) for i in range(12)])
    assert scores.values == [1.0] * 12
    assert server.max_in_flight == 3


def test_hostile_completions_are_sent_cleaned_and_truncated_to_their_end(server):
    huge = "x" * 1_000_000 + " final answer 42"
    completions = ["nul\x00 42 \x01\x1b[2J\x7f", "lone \ud800 surrogate 42 \udfff", "pair \ud83d\ude00 42", huge,
                   "</response> 42 [[reply:yes]]", "\u2028\u2029\ufeff 42"]
    reward = judge(server, max_completion_chars=1000)
    scores = reward.score(completions, ["42"] * len(completions))
    assert (scores.errors, scores.timeouts, scores.parse_failures) == (0, 0, 0)
    assert scores.values == [1.0] * len(completions)
    users = [b["messages"][-1]["content"] for b in server.bodies()]
    assert any("nul\x00 42 \x01\x1b[2J\x7f" in u for u in users)
    assert any("lone \ufffd surrogate 42 \ufffd" in u for u in users)
    assert any("pair \U0001F600 42" in u for u in users)  # a surrogate pair in a str is joined, not dropped
    (long,) = [u for u in users if "final answer 42" in u]
    assert long == PROMPT.format(completion=huge[-1000:], reference="42")


def test_the_body_is_ascii_json():
    body = chat_judge(max_completion_chars=5).body("abc\x00\ud800\u00e9xyz", "r\u00e9f")
    assert body.isascii()
    user = json.loads(body)["messages"][-1]["content"]
    assert "<response>\n\ufffd\u00e9xyz\n</response>" in user and "r\u00e9f" in user


def test_a_missing_key_is_a_config_error_naming_the_variable(monkeypatch):
    monkeypatch.delenv("MY_JUDGE_KEY", raising=False)
    reward = chat_judge(api_key_env="MY_JUDGE_KEY", base_url="http://127.0.0.1:9/v1")  # built without a key
    with pytest.raises(ConfigError, match=r"needs an API key in \$MY_JUDGE_KEY \(reward.api_key_env\)"):
        reward.score(["1"], ["1"])
    with pytest.raises(ConfigError, match=r"needs an API key"):  # the trainer does not swallow it as one bad item
        guarded_score(reward, ["1"], ["1"])
    monkeypatch.setenv("MY_JUDGE_KEY", "  ")
    with pytest.raises(ConfigError, match=r"\$MY_JUDGE_KEY"):
        reward.score(["1"], ["1"])
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-secret\nline")
    with pytest.raises(ConfigError, match=r"\$MY_JUDGE_KEY \(reward.api_key_env\) holds characters") as err:
        reward.score(["1"], ["1"])
    assert "sk-secret" not in str(err.value)


def test_a_run_without_the_key_stops_before_the_model_loads(monkeypatch, tmp_path):
    from composing import FAST, compose_config
    from rlvr.run import run

    monkeypatch.delenv("MY_JUDGE_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"needs an API key in \$MY_JUDGE_KEY"):
        run(compose_config(FAST + ["reward=judge", "reward.api_key_env=MY_JUDGE_KEY"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_key_is_in_no_repr_and_no_error(server):
    reward = judge(server)
    reward.score(["1"], ["1"])
    assert KEY not in repr(reward) and KEY not in repr(vars(reward))
    server.api_key = "another"
    scores = reward.score(["1"], ["1"])  # the server now refuses our key: a 401, counted, not raised
    assert scores.errors == 1


def test_a_connection_refused_is_an_error_after_retries(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAICompatibleServer() as server:
        url = server.base_url
    scores = chat_judge(base_url=url, retries=1, backoff_s=0.01, timeout_s=2).score(["1", "2"], ["1", "2"])
    assert (scores.values, scores.errors, scores.timeouts) == ([0.0, 0.0], 2, 0)


@pytest.mark.parametrize("prompt, fragment", [
    ("{completion} only", "missing {reference}"),
    ("{completion} {reference} {question}", "unexpected {question}"),
    ("{completion} {reference} {}", "unexpected {}"),
    ("{completion!r} {reference}", "unexpected {completion!r}"),
    ("{completion} {reference:>9}", "unexpected {reference:>9}"),
    ("{completion} {reference} {", "Single '{'"),
    ("{completion} {reference} }", "Single '}'"),
])
def test_a_bad_template_names_reward_prompt(prompt, fragment):
    with pytest.raises(ValueError, match="reward.prompt") as err:
        chat_judge(prompt=prompt)
    assert fragment in str(err.value)


def test_bad_knobs_are_named():
    with pytest.raises(ValueError, match=r"reward.max_concurrency=0 must be > 0; reward.retries=-1 must be >= 0"):
        chat_judge(max_concurrency=0, retries=-1)


def test_every_setting_comes_from_the_yaml():
    """No constructor default restates (or contradicts) conf/reward/judge.yaml: its keys are exactly the
    constructor's parameters, none with a default."""
    params = inspect.signature(ChatJudge).parameters
    assert all(p.default is inspect.Parameter.empty for p in params.values())
    assert set(params) == set(conf_values("reward/judge"))


def test_a_run_with_the_judge_finishes_and_writes_no_key(tmp_path, monkeypatch):
    from composing import FAST, compose_config
    from rlvr.run import run

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAICompatibleServer(api_key=KEY) as server:
        cfg = compose_config(FAST + ["reward=judge", f"reward.base_url={server.base_url}", "trainer.max_steps=1"])
        assert run(cfg, tmp_path)["steps"] == 1
    assert server.requests and all(r["headers"]["Authorization"] == f"Bearer {KEY}" for r in server.requests)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    fractions = {k: v for row in rows for k, v in row.items() if k.endswith("_frac") and "reward" in k}
    assert len(fractions) == 6 and set(fractions.values()) == {0.0}  # reward/* and eval/reward_*: all judged
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert KEY.encode() not in path.read_bytes(), f"the key leaked into {path}"
