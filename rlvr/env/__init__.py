"""Multi-turn environments (the `env` config group): what `Environment.episode(example, seed)` plays, one action
per turn (rlvr/protocols.py: Environment, Episode; rlvr/types.py: Step).

`env=none` (the default, conf/env/none.yaml) composes `env: null`: no environment, the single-turn path. Every
other option builds an environment by `_target_`:

  guess      a number-guessing game with higher/lower feedback, built in, small enough for the tiny CPU model
             (guess.py)
  retry      the run's data and verifier as "wrong, try again" until solved or out of turns (retry.py)
  textarena  a single-player TextArena game by registry id (textarena.py; `pip install -e ".[envs]"`)
  openenv    an OpenEnv environment, an in-process class or a server URL (openenv.py; the same extra)
  verifiers  an environment written with the verifiers library 0.4.0 (its v1 API), played in this process: rlvr's
             policy answers its model calls through verifiers' own interception server on 127.0.0.1, the rubric's
             reward comes on the last turn (verifiers.py, whose docstring has the bridge; the same extra). Not
             supported: verifiers' own harnesses, tools, sandboxes, per-turn rewards, forks (turn_credit=tl_grpo)
             and its 0.3 (v0) API

Every environment has `max_turns`, `max_context_tokens` and `step_timeout_s` (its YAML's knobs). The rollout
loop wraps it in `GuardedEnvironment` (guarded.py): every call bounded by `step_timeout_s`, an environment that
raises, hangs or answers something malformed costs that episode (reward 0, counted) and never the run.
Optional libraries are imported only when their option is built; each option's `needs` names the package and
its extra, so a missing one fails the run at start (and `rlvr doctor` reports it).
"""
