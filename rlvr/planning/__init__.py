"""Planning-token detection: which completion tokens are "strategic" (docs/algorithms.md#planning-tokens).

HICRA amplifies the credit of these tokens and SEPA leaves their uncertainty unreshaped; the trainer
computes the mask when the transform's `needs` require `planning_mask`. `regex.RegexPlanningDetector` is the only
detector so far (retrain's default); its module docstring says exactly what it takes and returns.
"""
