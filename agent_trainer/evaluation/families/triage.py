"""triage (held out): route a short support message to a queue, e.g. ``triage: my card was charged twice =`` ->
``billing``."""

from __future__ import annotations

import random

from agent_trainer.evaluation.families.base import Example, TaskFamily

# Queue -> key phrases that identify it. Messages are built as opener + phrase + closer.
PHRASES = {
    "billing": [
        "my card was charged twice", "i need a refund", "the invoice amount is wrong", "cancel my subscription payment",
        "why was i billed again", "the price on my receipt is off", "update my payment method", "i was overcharged",
    ],
    "technical": [
        "the app crashes on start", "i get an error when saving", "the page will not load", "sync stopped working",
        "the login button does nothing", "my upload keeps failing", "the screen goes blank", "search returns nothing",
    ],
    "account": [
        "i forgot my password", "change the email on my profile", "delete my account", "i am locked out",
        "add a second user", "rename my workspace", "turn on two factor login", "my username is wrong",
    ],
    "shipping": [
        "my parcel has not arrived", "the box came damaged", "change my delivery address", "where is my order",
        "tracking shows no update", "i got the wrong item", "the courier missed me", "ship it faster please",
    ],
}
# Enough openers and closers for a hidden pool of ~480 distinct messages (a 200-item hidden set needs it).
OPENERS = [
    "", "hi,", "hello,", "urgent:", "please help,", "hey team,", "quick question,", "good morning,", "sorry,",
    "hi there,", "support:", "help:",
]
CLOSERS = ["", "thanks", "asap", "today", "again", "please", "thank you", "cheers", "right now", "soon"]


class Triage(TaskFamily):
    name = "triage"
    version = 1
    instruction = (
        "Train the model to route a short support message to one queue: billing, technical, account "
        "or shipping. Prompts look like 'triage: my card was charged twice =' and the answer is the "
        "queue name, e.g. 'billing'."
    )
    scorer = "label"
    max_new_tokens = 3
    held_out = True
    labels = tuple(PHRASES)
    notes = "Held out: never trained on by the outer loop unless a config says so."

    def _sample(self, rng: random.Random) -> Example:
        label = rng.choice(self.labels)
        parts = [rng.choice(OPENERS), rng.choice(PHRASES[label]), rng.choice(CLOSERS)]
        return Example(prompt="triage: " + " ".join(p for p in parts if p) + " =", answer=label)
