"""Messages that name the fix (issue 37 #7), each case as a user met it: a function missing from a reward module,
a mistyped group inside a dotted key, a folder given as a file, a JSON-lines file with a byte-order mark, env knobs
without an env, an evaluation larger than its data, a full disk anywhere in the run folder, env=textarena on a model
too short for it. The command-line cases run `python train.py` as typed (exit 2 in about a second)."""

import errno
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composing import FAST, compose_config
from rlvr.build import build_all
from rlvr.data.jsonl import JSONL
from rlvr.errors import ConfigError, RunFailed
from rlvr.outputs import RunDir, disk_full
from rlvr.reward.function import load_function
from rlvr.run import run
from rlvr.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"prompt": f"{a}+{b}=", "reference": str(a + b)} for a in range(5) for b in range(4)]


def train(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`python train.py <args>` in the checkout, its run folder under tmp_path."""
    return subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **env})


def refused(overrides: list[str], run_dir: Path, monkeypatch) -> str:
    """The ConfigError `python train.py <overrides>` stops with, run in this process (before any model loads)."""
    monkeypatch.setattr(Trainer, "fit", lambda *a, **k: pytest.fail("the run started: the mistake was not caught"))
    with pytest.raises(ConfigError) as err:
        run(compose_config(overrides), run_dir)
    assert not run_dir.exists()
    return str(err.value)


def write_jsonl(path: Path, rows: list[dict], encoding: str = "utf-8") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding=encoding)
    return path


# ---- a reward module without the function named -------------------------------------------------------------------

def test_a_function_missing_from_a_reward_module_is_named_once(tmp_path):
    """Before: Hydra's get_method logged its error, then the run said it again, guessing "'my_rewards' is not a
    package" and "Are you sure that 'contains_anwser' is importable"."""
    (tmp_path / "my_rewards.py").write_text("def contains_answer(completion, reference):\n    return 1.0\n")
    proc = train(["reward=function", "reward.function=my_rewards.contains_anwser"], tmp_path,
                 PYTHONPATH=str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (f"reward.function='my_rewards.contains_anwser': module my_rewards ({tmp_path / 'my_rewards.py'}) has no "
            "function 'contains_anwser' (did you mean my_rewards.contains_answer?)") in proc.stderr
    assert proc.stderr.count("has no function") == 1 and "Traceback" not in proc.stderr
    assert "is not a package" not in proc.stderr and "Error getting callable" not in proc.stderr


def test_each_way_a_reward_function_cannot_load_names_the_one_thing_wrong(tmp_path, monkeypatch):
    (tmp_path / "needs_a_library.py").write_text("import no_such_library_rlvr\n\ndef score(c, r):\n    return 1.0\n")
    (tmp_path / "plain.py").write_text("THRESHOLD = 0.5\n\ndef alpha(c, r):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "no_such_module_rlvr.score": "cannot be imported: no module named 'no_such_module_rlvr' on the import path",
        "needs_a_library.score": "importing module needs_a_library raised ModuleNotFoundError: No module named "
                                 "'no_such_library_rlvr'",
        "plain.zeta": "module plain (", "plain.THRESHOLD": "is a float, not a function",
        "plain": "expected a dotted path module.function",
    }
    for name, expected in cases.items():
        with pytest.raises(ValueError) as err:
            load_function(name)
        assert expected in str(err.value), (name, str(err.value))
    with pytest.raises(ValueError, match=r"has no function 'zeta' \(its functions: alpha\)"):
        load_function("plain.zeta")
    assert load_function("plain.alpha")("x", "y") == 1.0
    assert load_function("os.path.join") is os.path.join  # a module inside a package


# ---- a mistyped group inside a dotted key; env knobs without an env ------------------------------------------------

@pytest.mark.parametrize("override,expected", [
    ("algorithm.los.mode=x", "algorithm.los.mode=x: algorithm has no key 'los' (did you mean algorithm.loss.mode=x?)"),
    ("algorithm.los.xyzzy=1", "algorithm.los.xyzzy=1: algorithm has no key 'los' (did you mean algorithm.loss?)"),
    ("trainer.sampling.temprature=1", "trainer.sampling.temprature=1: trainer.sampling has no key 'temprature' (did "
                                      "you mean trainer.sampling.temperature=1?)"),
    ("env.max_turns=3", "env.max_turns=3: env=none chooses no env, so nothing would read env.max_turns; choose one "
                        "with env=<option> (calculator, guess, openenv, retry, textarena, verifiers)"),
])
def test_a_key_hydra_cannot_override_names_the_key_meant(override, expected, tmp_path):
    """Before: `algorithm.los has no key 'mode'` (no suggestion: the missing part is `los`), and `env has no key
    'max_turns'` under env=none, though env=guess has one."""
    proc = train([override], tmp_path)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_an_env_knob_appended_without_an_env_names_the_env_options(tmp_path, monkeypatch):
    """`+env.max_turns=3` under env=none composed `env: {max_turns: 3}`; the check then crashed on its missing
    `_target_` (a traceback, exit 1)."""
    message = refused(["+env.max_turns=3", "+echo.coef=0.5"], tmp_path / "run", monkeypatch)
    assert ("env.max_turns=3: env=none chooses no env, so nothing would read env.max_turns; choose one with "
            "env=<option> (calculator, guess, openenv, retry, textarena, verifiers)") in message
    assert "echo.coef=0.5: echo=none chooses no echo, so nothing would read echo.coef; choose one with echo=<option> " \
           "(on)" in message


# ---- files: a folder given as one, a byte-order mark, an evaluation larger than its data ---------------------------

def test_a_folder_given_as_a_file_is_named_as_a_folder_with_the_file_meant(tmp_path, monkeypatch):
    """Before: `data.path='…': no such file`, about a folder that exists."""
    one = tmp_path / "one"
    one.mkdir()
    write_jsonl(one / "train.jsonl", ROWS)
    message = refused(["data=jsonl", f"data.path={one}", *FAST], tmp_path / "run", monkeypatch)
    assert (f"data.path='{one}' is a folder, not a file (expected a JSON-lines file); say "
            f"data.path={one / 'train.jsonl'}") in message
    write_jsonl(one / "test.jsonl", ROWS)
    message = refused(["data=math", f"data.path={one}", *FAST], tmp_path / "run", monkeypatch)
    assert f"data.path='{one}' is a folder, not a file (expected a .jsonl or .parquet file" in message
    assert f"it holds test.jsonl, train.jsonl: name one, data.path={one}/<file>" in message
    message = refused(["data=jsonl", f"data.path={one / 'train.jsonl'}", f"data.demonstrations_path={tmp_path}",
                       "trainer.warmup.steps=1"], tmp_path / "run", monkeypatch)
    assert f"data.demonstrations_path='{tmp_path}' is a folder, not a file (expected a JSON-lines file); it holds " \
           "no .jsonl file" in message


def make_jsonl(train: Path, eval_path: Path | None, eval_size: int = 500) -> JSONL:
    return JSONL(seed=0, path=str(train), eval_path=None if eval_path is None else str(eval_path), prompt_key="prompt",
                 reference_key="reference", eval_size=eval_size, prompt_template="{prompt}", shuffle=True)


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path):
    """Windows editors start a UTF-8 file with a byte-order mark; before, its first line was 'not valid JSON'."""
    data = make_jsonl(write_jsonl(tmp_path / "train.jsonl", ROWS, "utf-8-sig"),
                      write_jsonl(tmp_path / "eval.jsonl", ROWS, "utf-8-sig"), eval_size=0)
    assert (tmp_path / "train.jsonl").read_bytes().startswith(b"\xef\xbb\xbf")
    assert len(data.batch(0, len(ROWS))) == len(ROWS) == len(data.eval_examples())
    assert data.eval_examples()[0].prompt == "0+0=" and data.eval_examples()[0].reference == "0"


def test_an_eval_size_larger_than_the_held_out_file_is_said_at_start(tmp_path, caplog):
    train_file = write_jsonl(tmp_path / "train.jsonl", ROWS)
    eval_file = write_jsonl(tmp_path / "eval.jsonl", ROWS)
    with caplog.at_level(logging.WARNING):
        data = make_jsonl(train_file, eval_file, eval_size=500)
    assert len(data.eval_examples()) == len(ROWS)
    assert (f"data.eval_size=500 but data.eval_path='{eval_file}' holds {len(ROWS)} usable rows: every run evaluates "
            f"on those {len(ROWS)} (say data.eval_size=0 for all of them") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        make_jsonl(train_file, eval_file, eval_size=len(ROWS))
        make_jsonl(train_file, eval_file, eval_size=0)
    assert "data.eval_size" not in caplog.text


# ---- a full disk, wherever the run writes --------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of the size asked (a tmpfs; mounting one needs root, else the test skips)."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk-{size}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "--lazy", str(where)], check=False)  # lazy: a file a failure left open holds it


def fill(disk: Path) -> None:
    """Take every byte left on `disk` (a file of chunks, down to single bytes, until the disk refuses)."""
    with open(disk / "filler", "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC


def test_a_run_whose_disk_fills_up_stops_with_one_message_naming_the_folder(small_disk):
    """The disk fills while the run trains (another job's files): the run's next write (its samples, a metrics row)
    fails. Before: only a checkpoint's OSError had words; this was a traceback, and status.json said `running`."""
    disk = small_disk("256m")  # room enough for the check at start (a checkpoint's worth)
    folder = disk / "run"
    job = subprocess.Popen([sys.executable, "train.py", "trainer.warmup.steps=0", "trainer.max_steps=100000",
                            "data.eval_size=64", "threads=1", f"hydra.run.dir={folder}"], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 240
        while not (folder / "metrics.jsonl").exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the evaluation before training has written its row: the run is training
        fill(disk)
        _, stderr = job.communicate(timeout=240)
    finally:
        job.kill()
    assert job.returncode == 1, stderr[-3000:]
    said = [line for line in stderr.splitlines() if line.startswith("rlvr: run failed: ")]
    assert len(said) == 1 and "Traceback" not in stderr and "Logging error" not in stderr, stderr[-3000:]
    assert said[0].startswith(f"rlvr: run failed: the disk holding the run folder {folder} is full (0.0 MiB free): ")
    assert "No space left on device" in said[0] and "start the same command again" in said[0]
    status = json.loads((folder / "status.json").read_text())  # rewritten in place: no block for a new file
    assert status["state"] == "failed" and said[0].endswith(status["reason"])


def test_train_log_on_a_full_disk_drops_its_lines_without_a_traceback(small_disk, capsys):
    """A log line the full disk refuses: before, logging printed "--- Logging error ---" and a traceback on every
    line, and the run went on; now the line is dropped, and the run's next write of its record stops it with the
    one message (the test above)."""
    from rlvr.run_record import HeldFileHandler

    disk = small_disk("1m")
    handler = HeldFileHandler(str(disk / "train.log"))
    handler.open_in(disk)
    fill(disk)
    try:
        for i in range(200):  # ~16 KiB: past any block the log file holds
            handler.emit(logging.LogRecord("rlvr", logging.INFO, __file__, 1, "a line of the log %d" * 4, (i,) * 4,
                                           None))
    finally:
        handler.close()
    assert capsys.readouterr().err == ""


def test_torch_saves_wordless_error_on_a_full_disk_is_known_as_one(small_disk):
    """torch.save's C++ writer reports a full disk as "unexpected pos …": the disk's free space tells."""
    import torch

    disk = small_disk("1m")
    try:
        torch.save(torch.zeros(1 << 20), disk / "big.pt")
    except RuntimeError as err:
        text, full = str(err), disk_full(err, disk)
    assert "No space left" not in text and full
    assert not disk_full(RuntimeError(text), ROOT)  # the same words with space left: not the disk


def test_a_full_disk_while_writing_metrics_stops_the_run_with_the_same_message(tmp_path, monkeypatch):
    """Not only checkpoints: metrics.jsonl refusing a row (the OS's ENOSPC) ends the run the same way."""
    original = RunDir.append

    def append(self, name, row):
        if name == "metrics.jsonl" and "loss" in row:  # the first step's row
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path / name))
        original(self, name, row)

    monkeypatch.setattr(RunDir, "append", append)
    with pytest.raises(RunFailed) as err:
        run(compose_config(FAST + ["trainer.max_steps=2", "data.eval_size=8"]), tmp_path)
    message = str(err.value)
    assert message.startswith(f"the disk holding the run folder {tmp_path} is full (")
    assert f"OSError: [Errno 28] No space left on device: '{tmp_path / 'metrics.jsonl'}'" in message
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "failed" and status["reason"] == message


# ---- env=textarena on a model too short for it ---------------------------------------------------------------------

def test_textarena_on_the_tiny_model_names_the_overrides_that_fit(tmp_path, monkeypatch):
    message = refused(["env=textarena"], tmp_path / "run", monkeypatch)
    assert ("env.max_context_tokens=4096 does not fit: model <rlvr.model.tiny.TinyLlama> has 32 positions "
            "(model.max_positions); at most 32. To fit, give the model the positions (model.max_positions=4096), or "
            "the episodes fewer tokens (env.max_context_tokens=32, fewer turns with env.max_turns=N") in message


def test_the_docs_textarena_cpu_command_passes_every_check():
    """The command is run in full by hand (3 steps, ~45 s); the same sizes train end to end in
    tests/test_multiturn_libraries.py. Here: it is in docs/multiturn.md, and every check at start accepts it."""
    pytest.importorskip("textarena")
    page = (ROOT / "docs" / "multiturn.md").read_text()
    found = re.search(r"^python train\.py env=textarena (.*?)(?:#.*)?$", page.replace("\\\n", ""), re.MULTILINE)
    assert found, "docs/multiturn.md lost its CPU command for env=textarena"
    overrides = ["env=textarena", *shlex.split(found.group(1))]
    assert "model.max_positions=1024" in overrides
    components, _ = build_all(compose_config(overrides))
    assert components.env is not None
