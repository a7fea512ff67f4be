"""engine=sglang against a loopback server that implements SGLang 0.5.23's routes over the tiny model (SGLang itself
cannot run on this CPU: CUDA-only kernels, and its CPU build needs AMX and a source build).

The server (`SGLangLike`) is written from SGLang's own sources, not from what the engine sends: /v1/completions
takes only CompletionRequest's fields (its pydantic model forbids others), refuses top_k = 0, gives every copy of
an n > 1 request the same `sampling_seed`, returns `token_ids` (the stop token included) and log_softmax(logits / T)
before top-p with texts in `logprobs.tokens`; /load_lora_adapter refuses a name already loaded;
/update_weights_from_disk answers {"success", "message", "num_paused_requests"}. It samples with PyTorch from the
tiny model, W0 + adapter as PEFT loads the engine's folder, so parity here checks what the engine sends and reads
and what it writes for the server, not SGLang's kernels."""

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from engine.contract import PREFIXES, check_continued, check_rollouts, partial_segment
from engine.parity import max_logprob_gap, update
from hydra.utils import instantiate
from safetensors.torch import load_file

from composing import compose_config
from rlvr.backend.local import LocalBackend
from rlvr.build import build_all
from rlvr.engine.openai import PolicySyncError
from rlvr.engine.sglang import SGLangHost, cpu_has_amx
from rlvr.engine.sync_check import FLOAT32_TOLERANCE, StaleEngineError, check_sync
from rlvr.errors import ConfigError
from rlvr.model.tiny import TinyLlama
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
TOL = 1e-5
COMPLETION_FIELDS = {
    "best_of", "cache_salt", "custom_labels", "custom_logit_processor", "custom_params", "data_parallel_rank", "ebnf",
    "echo", "extra_key", "frequency_penalty", "ignore_eos", "images_config", "json_schema", "logit_bias", "logprobs",
    "lora_path", "max_tokens", "min_p", "min_tokens", "mm_processor_kwargs", "model", "n", "no_stop_trim",
    "presence_penalty", "priority", "prompt", "regex", "repetition_penalty", "response_format",
    "return_cached_tokens_details", "return_hidden_states", "return_routed_experts", "return_spec_tokens_details",
    "return_token_ids", "rid", "routed_experts_start_len", "seed", "session_id", "session_params",
    "skip_special_tokens", "stop", "stop_regex", "stop_token_ids", "stream", "stream_options", "suffix",
    "temperature", "top_k", "top_p", "user", "watermark", "bootstrap_host", "bootstrap_port", "bootstrap_room",
}
"""sglang 0.5.23 entrypoints/openai/protocol.py CompletionRequest (with PDRoutingFields' routing fields)."""


class SGLangLike:
    """SGLang's HTTP routes over a PyTorch model (module docstring); `requests` records (path, body)."""

    def __init__(self, model, eos_id: int, lora: bool = True, original_logprob: bool = False) -> None:
        self.base, self.eos_id, self.lora, self.original_logprob = model.eval(), eos_id, lora, original_logprob
        self.adapters: dict[str, torch.nn.Module] = {}
        self.folders: dict[str, str] = {}
        self.requests: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer(*outer.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                with outer.lock:
                    outer.requests.append((self.path, body))
                    answer = outer.post(self.path, body)
                if body.get("stream") and answer[0] == 200:
                    self._stream(answer[1])
                else:
                    self._answer(*answer)

            def _stream(self, reply):
                """The completion as SGLang streams it (serving_completions.py `_generate_completion_stream`): a
                chunk per token with its `token_ids` and `logprobs` deltas, the finish reason on the last, then
                `data: [DONE]`; a client that leaves ends it (SGLang then aborts the request)."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                choice = reply["choices"][0]
                ids, lps = choice["token_ids"], choice.get("logprobs", {}).get("token_logprobs")
                try:
                    for i, token in enumerate(ids):
                        delta = {"index": 0, "text": "", "token_ids": [token],
                                 "finish_reason": choice["finish_reason"] if i == len(ids) - 1 else None}
                        if lps is not None:
                            delta["logprobs"] = {"text_offset": [], "token_logprobs": [lps[i]],
                                                 "tokens": [f"<{token}>"], "top_logprobs": []}
                        chunk = {"id": reply["id"], "object": "text_completion", "model": reply["model"],
                                 "choices": [delta]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _answer(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()

    def get(self, path: str):
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "policy", "object": "model", "max_model_len": 32}]}
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: dict):
        if path == "/v1/completions":
            return self.complete(body)
        if path == "/load_lora_adapter":
            if not self.lora:
                return 400, {"success": False, "error_message": "LoRA is not enabled. Please set `--enable-lora`."}
            if body["lora_name"] in self.adapters:
                return 400, {"success": False, "error_message": f"The LoRA adapter {body['lora_name']} already exists"}
            self.adapters[body["lora_name"]] = self._merged(body["lora_path"])
            self.folders[body["lora_name"]] = body["lora_path"]
            return 200, {"success": True, "error_message": None, "loaded_adapters": {n: n for n in self.adapters}}
        if path == "/unload_lora_adapter":
            found = self.adapters.pop(body["lora_name"], None) is not None
            self.folders.pop(body["lora_name"], None)
            return (200 if found else 400), {"success": found, "error_message": None if found else "not loaded"}
        if path == "/update_weights_from_disk":
            state = load_file(str(Path(body["model_path"]) / "model.safetensors"))
            missing, _ = self.base.load_state_dict(state, strict=False)
            if [m for m in missing if m != "lm_head.weight"]:  # tied: written once, under the embedding's name
                return 400, {"success": False, "message": f"missing {missing}", "num_paused_requests": 0}
            self.adapters = {n: self._merged(self.folders[n]) for n in self.adapters}  # over the new base
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        return 404, {"detail": "Not Found"}

    def _merged(self, folder: str):
        """The base with the adapter in `folder` merged in (SGLang applies adapters over whatever base it has)."""
        from peft import PeftModel

        return PeftModel.from_pretrained(copy.deepcopy(self.base), folder).merge_and_unload().eval()

    @torch.no_grad()
    def complete(self, body: dict):
        unknown = set(body) - COMPLETION_FIELDS
        if unknown:
            return 400, {"object": "error", "message": f"Extra inputs are not permitted: {sorted(unknown)}"}
        if body.get("top_k", -1) < 1 and body.get("top_k", -1) != -1:
            return 400, {"object": "error", "message": "top_k must be -1 (disable), or at least 1"}
        if body["model"] != "policy":
            return 404, {"object": "error", "message": f"model {body['model']} not found"}
        model = self.base if body.get("lora_path") is None else self.adapters.get(body["lora_path"])
        if model is None:
            return 400, {"object": "error", "message": f"LoRA adapter {body['lora_path']} not loaded"}
        T, top_p, stops = body["temperature"], body["top_p"], set(body.get("stop_token_ids") or [])
        if not body.get("ignore_eos"):
            stops.add(self.eos_id)
        choices = []
        for index in range(body.get("n", 1)):
            gen = torch.Generator().manual_seed(body["seed"])  # every copy of the request: the same sampling_seed
            ids, lps = list(body["prompt"]), []
            for _ in range(body["max_tokens"]):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                if T == 0:
                    token, lp = int(logits.argmax()), 0.0
                else:
                    logp = torch.log_softmax(logits / T, -1)
                    probs = logp.exp()
                    if top_p < 1:
                        order = probs.argsort(descending=True)
                        keep = probs[order].cumsum(0) - probs[order] < top_p
                        probs = torch.zeros_like(probs).scatter(0, order[keep], probs[order][keep])
                    token = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
                    lp = float(torch.log_softmax(logits, -1)[token]) if self.original_logprob else float(logp[token])
                ids.append(token)
                lps.append(lp)
                if token in stops:
                    break
            out = ids[len(body["prompt"]):]
            choice = {"index": index, "text": "", "finish_reason": "stop" if out and out[-1] in stops else "length",
                      "matched_stop": out[-1] if out and out[-1] in stops else None}
            if body.get("return_token_ids"):
                choice["token_ids"] = out
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"text_offset": [], "token_logprobs": lps, "tokens": [f"<{t}>" for t in out],
                                      "top_logprobs": []}
            choices.append(choice)
        return 200, {"id": "cmpl", "object": "text_completion", "model": body["model"], "choices": choices}


def backend_for(lora: bool) -> tuple[LocalBackend, object]:
    model, tok = TINY.load(0)
    spec = LoraSpec(8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]) if lora else None
    backend = LocalBackend(model, spec, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # W0 moved as a warm-up would (the server starts on the seed-0 init), B made non-zero
        for name, p in backend.policy.named_parameters():
            if "lora_B" in name or ("lora_" not in name and "embed" not in name):
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return backend, tok


def engine_for(backend, tok, base_url: str, *overrides: str):
    make = instantiate(compose_config(["engine=sglang", f"engine.base_url={base_url}", *overrides]).engine,
                       _partial_=True, _convert_="all")
    return make(policy=backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_parity_before_and_after_an_update_over_sglang_routes(lora, tmp_path):
    backend, tok = backend_for(lora)
    server = SGLangLike(TINY.load(0)[0], tok.eos_token_id)
    engine = engine_for(backend, tok, server.base_url, f"engine.workdir={tmp_path}", "engine.max_concurrency=4",
                        "engine.probe_tokens=4")
    try:
        engine.connect()  # W0 (+ the adapter) pushed, then the probe at T = 0.5 agrees
        assert engine.last_probe["mean"] < TOL
        params = SamplingParams(1.0, 1.0, 6)
        before = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, 3))
        check_rollouts(before, rows=12, max_tokens=6, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
        assert max_logprob_gap(backend.policy, before) < TOL
        # SGLang's logprobs are temperature-scaled before top-p: no refusal at T < 1 with top_p < 1
        warm = engine.sample(PROMPTS[:2], 2, SamplingParams(0.7, 0.8, 6), seeds=prompt_seeds(1, 2))
        assert max_logprob_gap(backend.policy, warm) < TOL
        again = engine.sample(PROMPTS[:1], 4, params, seeds=prompt_seeds(0, 3)[:1])
        assert torch.equal(before.tokens_PG_T[:4, : again.tokens_PG_T.shape[1]], again.tokens_PG_T)  # seeded
        group = {tuple(r) for r in before.tokens_PG_T[:4].tolist()}
        assert len(group) > 1  # one request per sample, seeds s_p + g: a group's rows differ
        update(backend.policy, "lora_B" if lora else "")
        check = [engine, backend.policy, [tok.eos_token_id], 4, FLOAT32_TOLERANCE, 3]
        with pytest.raises(StaleEngineError):
            check_sync(*check)
        written = engine.sync(backend.policy)
        assert written > 0 and check_sync(*check)["engine/sync_check_delta"] < TOL
        after = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, 3))
        assert max_logprob_gap(backend.policy, after) < TOL
        assert not torch.allclose(before.logprobs_PG_T, after.logprobs_PG_T, atol=1e-3)
        paths = [p for p, _ in server.requests]
        completions = [b for p, b in server.requests if p == "/v1/completions"]
        assert all(b["n"] == 1 and b["top_k"] == -1 and b["return_token_ids"] for b in completions)
        if lora:
            loads = [b["lora_name"] for p, b in server.requests if p == "/load_lora_adapter"]
            assert len(loads) == len(set(loads)) == 2  # connect, the sync: a fresh name each time
            assert [b["lora_name"] for p, b in server.requests if p == "/unload_lora_adapter"] == loads[:1]
            assert paths.count("/update_weights_from_disk") == 1  # W0 at connect
            assert {b.get("lora_path") for b in completions} == set(loads)
        else:
            assert paths.count("/update_weights_from_disk") == 2 and "/load_lora_adapter" not in paths
        # Staged (sampling k >= 2 ahead, rlvr/overlap.py): under LoRA the next version is loaded under its own name and
        # probed there while requests still name the current one; `load` switches them over. Full fine-tuning: the
        # server holds one set of weights, so the engine declines and the trainer syncs once the sampler is idle.
        current = copy.deepcopy(backend.policy)
        update(backend.policy, "lora_B" if lora else "")
        staged = engine.stage(backend.policy)
        if lora:
            assert staged is not None and engine.last_probe["mean"] < TOL
            name = [b["lora_name"] for p, b in server.requests if p == "/load_lora_adapter"][-1]
            assert len(server.adapters) == 2 and engine.served != name
            version = copy.deepcopy(backend.policy)
            update(backend.policy, "lora_B")  # the trainer goes on
            assert max_logprob_gap(current, engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(2, 3))) < TOL
            staged.load()
            assert list(server.adapters) == [name] == [engine.served]
            assert max_logprob_gap(version, engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(2, 3))) < TOL
        else:
            assert staged is None
    finally:
        engine.close()
        server.close()
    if lora:
        assert list(server.adapters) == []  # close unloaded the last adapter


def test_partial_rollouts_stream_each_row_and_close_what_still_runs(tmp_path):
    """continue_rows (trainer.partial_rollouts) over SGLang's streamed completions: the segment ends once one row
    has, the others cut where their streams were (this stand-in sends a completion once it has all of it: a row
    has all its tokens or none); resubmitted, a prefix is continued, every token's log-probability the policy's
    given the tokens before it."""
    backend, tok = backend_for(lora=True)
    server = SGLangLike(TINY.load(0)[0], tok.eos_token_id)
    engine = engine_for(backend, tok, server.base_url, f"engine.workdir={tmp_path}", "engine.probe_tokens=4")
    try:
        engine.connect()
        before = len(server.requests)
        first = engine.continue_rows(partial_segment(PROMPTS, [[], [], []], need=1, forced=[False] * 3))
        assert any(first.ended) and not all(first.ended), first
        streamed = server.requests[before:]  # a row whose stream was closed before it was sent is not there
        assert streamed and all(path == "/v1/completions" and body["stream"] for path, body in streamed)
        rest = engine.continue_rows(partial_segment(PROMPTS, PREFIXES, 3, [True] * 3))
        check_continued(backend.policy, PROMPTS, PREFIXES, rest, [0, 1, 2], tok.eos_token_id, TOL)
    finally:
        engine.close()
        server.close()


def test_a_server_without_lora_stops_the_run_naming_its_flags(tmp_path):
    backend, tok = backend_for(True)
    server = SGLangLike(TINY.load(0)[0], tok.eos_token_id, lora=False)
    engine = engine_for(backend, tok, server.base_url, f"engine.workdir={tmp_path}")
    try:
        with pytest.raises(PolicySyncError, match=r"load_lora_adapter answered HTTP 400.*--enable-lora"):
            engine.connect()
    finally:
        engine.close()
        server.close()


def test_original_logprobs_are_told_apart_and_refused_below_temperature_one(tmp_path):
    backend, tok = backend_for(False)
    server = SGLangLike(TINY.load(0)[0], tok.eos_token_id, original_logprob=True)  # SGLANG_RETURN_ORIGINAL_LOGPROB=1
    engine = engine_for(backend, tok, server.base_url, f"engine.workdir={tmp_path}")
    try:
        with pytest.raises(PolicySyncError, match="set engine.logprobs_mode=raw_logprobs"):
            engine.connect()
    finally:
        engine.close()
    engine = engine_for(backend, tok, server.base_url, f"engine.workdir={tmp_path}",
                        "engine.logprobs_mode=raw_logprobs")
    try:
        engine.connect()
        assert max_logprob_gap(backend.policy, engine.sample(PROMPTS, 2, SamplingParams(1.0, 1.0, 6),
                                                             seeds=prompt_seeds(0, 3))) < TOL
        with pytest.raises(ValueError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
            engine.sample(PROMPTS, 2, SamplingParams(0.7, 1.0, 6), seeds=prompt_seeds(0, 3))
    finally:
        engine.close()
        server.close()


def test_a_local_sglang_server_is_refused_at_start_where_sglang_cannot_run():
    build_all(compose_config(["engine=sglang", "engine.base_url=http://gpu-box:30000/v1"]))  # elsewhere: not asked
    if torch.cuda.is_available() or cpu_has_amx():
        pytest.skip("this machine could run an SGLang server")
    found = SGLangHost("http://127.0.0.1:30000/v1").check()
    assert found.status == "missing" and "CUDA-only" in found.detail
    with pytest.raises(ConfigError, match=r"engine.base_url=http://127.0.0.1:30000/v1 is this machine.*CUDA-only"):
        build_all(compose_config(["engine=sglang"]))
