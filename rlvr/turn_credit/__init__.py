"""Turn-level credit for multi-turn episodes (`turn_credit=<option>`, docs/algorithms.md#turn-credit).

An episode is packed as one row: action 0, observation 0, action 1, … (rlvr/types.py, `Rollouts`). A
turn-credit option turns the step's episode advantages and what the rollout measured per turn into one
advantage per token, non-zero only on action tokens; the token transform, the batch pass and the cap then
run on them as on a single-turn step:

    adv_P_G  = algorithm.advantages(rewards_P_G), tied groups zeroed      (rlvr/credit.py)
    adv_PG_T, metrics = turn_credit(adv_P_G, rewards_P_G, turns)          this package
    → transform → algorithm.normalize → loss.cap

Every option is called the same way (`turns` is a `TurnSignals`, rlvr/turn_credit/signals.py) and each reads
what it needs from it:

    episode        adv_P_G on every action token                                       reads nothing more
    reward_to_go   G_k − mean over the group of G_k, G_k = Σ_{j≥k} γ^{j−k} r_j          turn_rewards_PG_K
    env            the environment's per-turn advantages (MT-GRPO), else episode      env_adv_PG_K, rewards_P_G
    tl_grpo        (primary − mean(branches))/(std + 1e-8) + w·(r − EMA)              branch_rewards_PG_K_B, rewards_P_G

The shape every option has (a Protocol for rlvr/protocols.py):

    needs(settings) -> Needs                                 classmethod; tl_grpo requires "fork"
    branching: Branching | None                              what the rollout probes (tl_grpo's), else None
    __call__(adv_P_G, rewards_P_G, turns) -> (adv_PG_T, metrics)
    state_dict() -> dict;  load_state_dict(dict)             tl_grpo's EMA baseline; {} for the others

Calls must come once per step, in step order: tl_grpo folds the step's rewards into its baseline.
"""
