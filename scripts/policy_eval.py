"""A run's policies played again on the same tasks and episode seeds: the warm start against the last checkpoint
(or any steps), no update, paired episode by episode; with several runs (seeds), the mean gain over them.

    .venv/bin/python scripts/policy_eval.py runs/<run>                          # training families, 4 episodes each
    .venv/bin/python scripts/policy_eval.py runs/sweep/0 runs/sweep/1 runs/sweep/2 --out cmp/   # three seeds
    .venv/bin/python scripts/policy_eval.py runs/<run> --families heldout --episodes 8 --steps start,5,last

``--families``: ``train`` (the run's training families), ``heldout`` or names with commas. ``--steps``: ``start``
(the warm start), ``last`` or step numbers; the gain is the last listed over the first. Each run's episodes and
``policy_eval.json`` go to ``<run>/evals/<families>_e<episodes>/``; ``--out`` also writes the table
(``policy_eval.md``), every figure (``policy_eval.json``) and the reward against the updates (``policy_eval.png``).
The warm start is played once for runs that would play it the same (same agent, tasks and episode settings).
agent_trainer/outer_loop/rl/policy_eval.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="at-train run folders")
    ap.add_argument("--families", default="train", help="train, heldout, or family names separated by commas")
    ap.add_argument("--episodes", type=int, default=4, help="episodes per task and policy (default 4)")
    ap.add_argument("--steps", default="start,last", help="start, last or step numbers, separated by commas")
    ap.add_argument("--out", type=Path, help="also write policy_eval.md and policy_eval.json to this folder")
    args = ap.parse_args(argv)

    from agent_trainer.cli_args import UserError
    from agent_trainer.outer_loop.rl.policy_eval import check_runs, evaluate_runs, markdown, plot

    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in ("start", "last") and not s.isdigit()]
    if bad or args.episodes < 1:
        print(f"policy_eval: --steps takes start, last or step numbers (got {bad}); --episodes at least 1",
              file=sys.stderr)
        return 2
    try:
        check_runs(args.runs, args.families, steps)   # a mistake is named in a second, before torch is imported
        from agent_trainer.outer_loop.rl.run_config import quiet_libraries

        quiet_libraries()
        result = evaluate_runs(args.runs, args.families, args.episodes, steps)
    except UserError as e:
        print(f"policy_eval: {e}", file=sys.stderr)
        return 2
    table = markdown(result)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "policy_eval.md").write_text(table)
        (args.out / "policy_eval.json").write_text(json.dumps(result, indent=2))
        plot(result, args.out / "policy_eval.png")
        print(f"policy_eval: {args.out / 'policy_eval.md'}, .json, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
