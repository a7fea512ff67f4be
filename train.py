"""rlvr entry point: compose the config with Hydra, then hand it to rlvr.run inside the job.

Nothing heavy (torch, transformers) is imported here, so `--cfg`, `--help` and submitting a sweep stay
fast; the job imports it when it starts.
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    from rlvr.run import run

    return run(cfg)["eval_accuracy_final"]  # the value a Hydra sweeper would optimise


if __name__ == "__main__":
    main()
