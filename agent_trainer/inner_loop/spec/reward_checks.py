"""Checks on agent reward code beyond hidden text: a reward must not be an answer oracle keyed by prompt.

    problem = answer_table_problem(ast.parse(source))   # why the file looks like a lookup table, or None

A reward that holds answers keyed by digests of prompts (``{sha256(prompt)[:16]: answer}``) pays the
model for reciting answers it cannot compute, and the contamination check, which searches reward
source for hidden *text*, cannot see a digest. Legitimate rewards compute from the prompt and the
completion; they hold a few constants, not tables of opaque keys. What this covers and what it does
not: docs/security.md.
"""

from __future__ import annotations

import ast
import re

MAX_OPAQUE_CONSTANTS = 16  # digest-like constants a reward file may hold
MAX_OPAQUE_RUN = 256       # characters of hex or base64 in one constant (a table packed into a string)
_HEX = re.compile(r"^(?:0x)?[0-9a-fA-F]{8,}$")
_B64 = re.compile(r"^[A-Za-z0-9+/_-]{12,}={0,2}$")
_RUN = re.compile(r"[0-9a-fA-F]{%d,}|[A-Za-z0-9+/_-]{%d,}" % (MAX_OPAQUE_RUN, MAX_OPAQUE_RUN))


def _opaque(value: object) -> bool:
    """A constant that looks like a digest or a key derived from one: hex, base64 without spaces, a big integer."""
    if isinstance(value, bytes):
        return len(value) >= 8
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) >= 2**40
    if isinstance(value, str):
        has_digit_and_letter = any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
        return bool(_HEX.match(value) or (_B64.match(value) and has_digit_and_letter))
    return False


def answer_table_problem(tree: ast.AST) -> str | None:
    """Why the parsed reward file looks like an answer table keyed by prompt digests, or None."""
    opaque, packed = 0, None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant):
            continue
        if _opaque(node.value):
            opaque += 1
        if isinstance(node.value, (str, bytes)) and packed is None:
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if _RUN.search(text):
                packed = node.lineno
    if opaque > MAX_OPAQUE_CONSTANTS:
        return (f"holds {opaque} digest-like constants (hex, base64 or integers of 2^40 and more); a reward "
                "may not look answers up by a key derived from the prompt")
    if packed is not None:
        return (f"line {packed} holds a run of {MAX_OPAQUE_RUN}+ hex or base64 characters (a packed table); "
                "a reward may not look answers up by a key derived from the prompt")
    return None
