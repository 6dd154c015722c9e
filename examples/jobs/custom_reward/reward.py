"""Agent-written reward for calc_chain: partial credit for near numbers, a penalty for non-numbers."""


def closeness_or_penalty(prompts, completions, answer, **kwargs):
    """1 / (1 + |got - want|) when the first line is an integer, else -0.5 (teaches the format)."""
    rewards = []
    for completion, want in zip(completions, answer):
        first_line = completion.strip().split("\n")[0].strip()
        try:
            got = int(first_line)
        except ValueError:
            rewards.append(-0.5)
            continue
        rewards.append(1.0 / (1.0 + abs(got - int(want))))
    return rewards
