"""`rlvr status | compare | plot`: readers of run folders. They read plain files only (no torch, no Hydra
composition), so they are fast and work offline on a copy of `outputs/`."""
