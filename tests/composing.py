"""Composing the real conf/ in tests, exactly as `python train.py <overrides>` does, and the option lists
read from conf/ (so that a new option file is tested without editing a list)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: list[str]):
    """The real composed config (conf/train.yaml) with overrides, as `python train.py <overrides>` sees it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@contextmanager
def composer(conf_dir: Path = CONF_DIR) -> Iterator[Callable[..., DictConfig]]:
    """compose(overrides, hydra=False) for many compositions under one Hydra initialisation (faster)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        yield lambda overrides, hydra=False: compose(config_name="train", overrides=overrides,
                                                     return_hydra_config=hydra)


def compose_options(group: str) -> dict[str, DictConfig]:
    """Every option of an object group (not a `_global_` one such as condition), as `<group>=<option>` composes
    it, in ONE composition: each is selected into its own package (`+<group>@_options.<option>=<option>`), where
    the defaults list it extends resolves relative to that package too. ~0.05 s an option instead of ~0.2 s. An
    option with a package of its own (`# @package _global_`: env=guess, a preset; `algorithm.loss.correction`)
    composes by itself, read where it lands (a _global_ one: at `<group>`)."""
    names = options(group)
    packages = {n: package_of(CONF_DIR / group / f"{n}.yaml") for n in names}
    together = [n for n in names if packages[n] is None]
    cfg = compose_config([f"+{group}@_options.{name}={name}" for name in together])

    def alone(name: str) -> DictConfig:
        package = packages[name]
        return OmegaConf.select(compose_config([f"{group}={name}"]), group if package == "_global_" else package)

    return {name: cfg._options[name] if name in together else alone(name) for name in names}


def package_of(option_file: Path) -> str | None:
    """The `# @package` an option file names in its first line, or None."""
    first = option_file.read_text().split("\n", 1)[0]
    return first.removeprefix("# @package ").strip() if first.startswith("# @package ") else None


def groups(conf_dir: Path = CONF_DIR) -> list[str]:
    """Every config group of conf/ as Hydra names it (a folder holding option files; nested: `algorithm/loss`),
    Hydra's own (conf/hydra/...) left out."""
    found = {p.parent.relative_to(conf_dir).as_posix() for p in conf_dir.rglob("*.yaml") if p.parent != conf_dir}
    return sorted(g for g in found if g != "hydra" and not g.startswith("hydra/"))


def options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The option names of one group: its file names, as `python train.py --help` lists them."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def option_overrides(conf_dir: Path = CONF_DIR) -> list[str]:
    """`group=option` for every option of every group."""
    return [f"{g}={o}" for g in groups(conf_dir) for o in options(g, conf_dir)]


def option_defaults(group: str, option: str, conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """The group choices an option file's own defaults list makes, e.g. a condition's
    `override /algorithm: maxrl` → {"algorithm": "maxrl"}."""
    picks: dict[str, str] = {}
    for entry in OmegaConf.load(conf_dir / group / f"{option}.yaml").get("defaults", []):
        if isinstance(entry, DictConfig):
            for key, value in entry.items():
                picks[str(key).removeprefix("override ").lstrip("/").split("@")[0]] = value
    return picks


# The golden `--cfg job` text of every option (tests/test_cfg_golden.py); regenerate it with
# `python tests/fixtures/make_cfg_golden.py` and review the diff.
GOLDEN = Path(__file__).resolve().parent / "fixtures" / "cfg_job_golden.txt"
DEFAULT = "(default)"
HYDRA_SUFFIX = " (hydra)"
HYDRA_KEYS = ("mode", "run", "sweep", "sweeper", "callbacks")  # what campaigns set; the rest is Hydra's own
MARK = "#### "


def cfg_job_texts(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """`python train.py [group=option] --cfg job` for no override and every option, plus the hydra keys that
    options may set (HYDRA_KEYS, as `--cfg hydra` prints them) under "<key> (hydra)" where they differ from the
    default's."""
    texts: dict[str, str] = {}
    with composer(conf_dir) as compose:
        for key in [DEFAULT, *option_overrides(conf_dir)]:
            cfg = compose([] if key == DEFAULT else [key], hydra=True)
            hydra = OmegaConf.to_yaml({"hydra": OmegaConf.masked_copy(cfg.hydra, list(HYDRA_KEYS))})
            with open_dict(cfg):
                del cfg["hydra"]  # as --cfg job (and compose without return_hydra_config) does
            texts[key] = OmegaConf.to_yaml(cfg)
            if key == DEFAULT or hydra != texts[DEFAULT + HYDRA_SUFFIX]:
                texts[key + HYDRA_SUFFIX] = hydra
    return texts


def read_golden(path: Path = GOLDEN) -> dict[str, str]:
    texts: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith(MARK):
            lines = texts.setdefault(line[len(MARK):].rstrip("\n"), [])
        else:
            lines.append(line)
    return {key: "".join(value) for key, value in texts.items()}


def write_golden(texts: dict[str, str], path: Path = GOLDEN) -> None:
    head = ("# `python train.py <key> --cfg job` for every option of conf/ (tests/test_cfg_golden.py);\n"
            f"# \"<key> (hydra)\": hydra.{{{','.join(HYDRA_KEYS)}}} of `--cfg hydra`, where not the default's.\n"
            "# Regenerate: python tests/fixtures/make_cfg_golden.py  (then review the diff: it should show only what"
            " you meant to change)\n")
    path.write_text(head + "".join(f"{MARK}{key}\n{text}" for key, text in texts.items()))


# Settings that keep a real run of the embedded default CPU-test sized: no warm-up cache in $HOME,
# a small held-out set, and 1 thread (pytest may share the 2 cores with another job).
FAST = [
    "trainer.warmup.steps=0",
    "trainer.warmup.cache_dir=null",
    "trainer.eval_every=0",
    "trainer.log_every=1",
    "data.eval_size=64",
    "threads=1",
]

# An untrained policy with a verifier that pays about half of its completions: mixed groups, so steps train,
# without the 800-step warm-up that only the learning test needs.
MIXED = ["trainer.warmup.steps=0", "reward=function", "reward.function=tests.backpressure.mixed_rewards.parity"]
OVERLAP = ["correction=token_tis", "algorithm.loss.correction.pi_old=decoupled"]
"""The loss trainer.off_policy_steps ≥ 1 needs (rlvr/trainer_rules.py: overlap_errors)."""
