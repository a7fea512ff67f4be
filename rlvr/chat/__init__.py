"""What multi-turn episodes need of a model's chat template, below both the episode loop (rlvr/rollout/) and the tool
harness (rlvr/tools/), which import it and never each other:

    turns.py        an observation's ids after an action (a user message's), derived from the template
    tools.py        a tool episode's prompt (the tools' schemas shown) and its tool turns' ids
    observation.py  the ids any observation adds to an episode's row: a user turn, a tool turn, or plain text
    rewrites.py     where a template rewrites earlier turns (`TemplateView`): an episode's row splits there
    check.py        the start-up check of a template (`check_chat`), before the warm-up and any training
"""
