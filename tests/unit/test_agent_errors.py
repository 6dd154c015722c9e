"""Errors from agent code reach the agent as the exception's type and a bounded first line, nothing more.

An agent's reward may raise with any text, e.g. a file it read in the sandbox: only the type, the first
line of the message (bounded) and the reward file's line number come back; a host that dies leaves its
output in the harness's files only.
"""

from __future__ import annotations

import pytest

from agent_trainer.inner_loop.isolation.reward_proxy import AGENT_ERROR_CHARS, agent_error, score_with_host
from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy, bwrap_problem
from agent_trainer.inner_loop.spec.jobspec import RewardSpec

MARK = "SANDBOX-FILE-CONTENT"
REQUEST = {"prompts": ["a", "b"], "completions": ["1", "2"], "columns": {"answer": ["1", "3"]}}
SOURCES = {
    "import": f"import os\nraise ValueError('first line\\n{MARK}' + open(os.__file__).read())\n",
    "call": ("def mine(prompts, completions, **kw):\n"
             f"    import os\n    raise RuntimeError('x' * 5000 + '{MARK}' + '\\n' + open(os.__file__).read())\n"),
    "exit": f"import os, sys\nprint('{MARK}' * 50)\nsys.stderr.write('{MARK}')\nos._exit(3)\n",
    "syntax": f"def mine(prompts, completions, **kw):\n    return [{MARK} for\n",
}


@pytest.mark.parametrize("policy", [SandboxPolicy(), SandboxPolicy(sandbox=False, allow_unsafe=True)],
                         ids=["bwrap", "unsafe"])
@pytest.mark.parametrize("case", sorted(SOURCES))
def test_agent_errors_carry_type_and_first_line_only(tmp_path, policy, case):
    if policy.sandbox and bwrap_problem() is not None:
        pytest.skip(f"bubblewrap unusable: {bwrap_problem()}")
    (tmp_path / "reward.py").write_text(SOURCES[case])
    spec = RewardSpec.model_validate({"file": "reward.py", "functions": [{"name": "mine", "source": "file"}]})
    out = score_with_host(spec, tmp_path, REQUEST, timeout_s=30, policy=policy)
    text = str(out)
    assert MARK not in text and "Traceback" not in text, text
    message = out.get("load_error") or out.get("crash") or out["errors"]["mine"]
    assert "\n" not in message and len(message) < AGENT_ERROR_CHARS + 120, message
    expected = {"import": "failed on import: ValueError: first line (line 2)",
                "call": "raised: RuntimeError: xxx", "exit": "exited with code",
                "syntax": "failed on import: SyntaxError"}[case]
    assert expected in message, message


def test_agent_error_is_one_printable_bounded_line():
    assert agent_error("\n\n  Boom: bad\x1b[31m\nsecond line") == "Boom: bad?[31m"
    assert len(agent_error("y" * 10_000)) == AGENT_ERROR_CHARS
