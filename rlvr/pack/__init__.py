"""Packed grids: several runs of one sweep (its cells) trained in one process, on one base model.

`hydra/launcher=packed` (rlvr/launcher/packed.py) hands the runs that can share a process to `run_pack`
(cells.py). Each cell is an ordinary run: the job the basic launcher would run (`train.py`'s task function, on
its composed config, in its own run folder), in a thread of its own. The threads take turns, one running at a
time, so each cell's global random streams, Hydra job config and log are its own (swapped at every turn); a cell
hands the turn on where it asks its engine for samples, and once every cell waits there the pack samples them
together (sampling.py): with engine=pytorch one decoding loop over all cells' rows, each row through its own
cell's weights. Everything else (scoring, credit, the training step, evaluation's scoring, checkpoints) is the
cell's own code on its own data, as in a solo run.
"""
