"""Strategies: labels and switches, steering messages, the CONTINUE/SWITCH protocol, the evaluator agent, journal
and skills, at-fork."""
