"""Which kernel settings move an example job's numbers on this machine: the job's first steps traced
(``agent_trainer.trace``) under the portable kernels and under each candidate change, each in a fresh process, and
every candidate's trace compared with the portable one's. A setting that moves the trace names a library whose ops
are in the job's path (MKL, oneDNN, ATen's vector kernels); one that does not clears it for this job.

    .venv/bin/python bench/kernel_suspects.py                         # grpo_lora, 10 steps, every candidate
    .venv/bin/python bench/kernel_suspects.py --steps 5 --candidates portable,mkl_avx2
    .venv/bin/python bench/kernel_suspects.py --json out.json         # the comparisons as JSON too

Each process trains as ``bench/reproduce.py`` runs the job (one torch thread, the job's own learning-rate schedule
of all its steps), stopped after ``--steps``, and scores the model on the first 200 hidden items (the trace's
``eval``). The first candidate, ``portable``, is the reference; ``portable_again`` runs it once more (the control:
it must compare equal). Findings of 2026-12-07 on an AMD EPYC: docs/results/2026-12-07-portable-kernels-amd.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from agent_trainer.kernels import PORTABLE_KERNELS  # noqa: E402
from agent_trainer.trace import TRACE_ENV, TRACE_FILE, compare, read  # noqa: E402

# name -> (environment on top of the portable kernels, torch flags set in the process, why it is a candidate)
CANDIDATES = {
    "portable": ({}, {}, "the reference: torch AVX2, MKL_CBWR=COMPATIBLE, oneDNN at most AVX2"),
    "portable_again": ({}, {}, "the control: the same setting in a new process"),
    "mkl_avx2": ({"MKL_CBWR": "AVX2"}, {}, "MKL's AVX2 branch: moves the trace iff an MKL op (BLAS, LAPACK: the "
                                             "SVD of PiSSA) is in the path"),
    "mkl_strict": ({"MKL_CBWR": "COMPATIBLE,STRICT"}, {}, "MKL's strict CNR mode (also pins the reduction order "
                                                          "of unaligned data)"),
    "onednn_sse41": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, {}, "oneDNN's SSE4.1 kernels: moves the trace iff a oneDNN "
                                                          "op is in the path"),
    "mkldnn_off": ({}, {"mkldnn": False}, "torch.backends.mkldnn off: every oneDNN op falls back to ATen/MKL"),
    "aten_default": ({"ATEN_CPU_CAPABILITY": "default"}, {}, "ATen's scalar kernels instead of AVX2 (softmax, exp, "
                                                             "sampling, the optimizer's reductions)"),
}


def run_one(name: str, job: str, steps: int, out: Path) -> None:
    """In this process (its environment set by the parent): train ``job`` for ``steps`` steps, traced, and score."""
    import torch
    from transformers import TrainerCallback

    from agent_trainer.evaluation.hidden_eval import trace_checkpoint
    from agent_trainer.inner_loop.models.registry import resolve_model
    from agent_trainer.inner_loop.spec.jobspec import load_job
    from agent_trainer.inner_loop.train.stages import prepare_stage
    from agent_trainer.inner_loop.train.train import train
    from agent_trainer.trace import append

    torch.set_num_threads(1)
    if CANDIDATES[name][1].get("mkldnn") is False:
        torch.backends.mkldnn.enabled = False

    class StopAfter(TrainerCallback):
        """Ends training after ``steps`` steps, leaving the schedule of the job's whole length."""

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = control.should_training_stop or state.global_step >= steps
            return control

    job_dir = C.ROOT / "examples" / "jobs" / job
    spec = load_job(job_dir, "calc_chain")
    model = resolve_model(spec.base_model)
    rows, rewards, _, _ = prepare_stage(spec, job_dir, model, "calc_chain")
    report = train(spec, rows, rewards, model, out, max_steps=spec.hyperparameters.max_steps,
                   callbacks=[StopAfter()])
    append(out / TRACE_FILE, trace_checkpoint(report.model_dir, "calc_chain", 200))


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.strip().splitlines()[0])
    p.add_argument("--job", default="grpo_lora", help="an example job (examples/jobs)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--candidates", default=",".join(CANDIDATES), help=f"comma-separated, of {', '.join(CANDIDATES)}")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # a candidate's own process
    args = p.parse_args(argv)
    wd = C.workdir(args.workdir, "kernel_suspects")
    if args.one:
        run_one(args.one, args.job, args.steps, wd / args.one)
        return 0
    names = [x for x in args.candidates.split(",") if x]
    unknown = sorted(set(names) - set(CANDIDATES)) + ([] if (C.ROOT / "examples" / "jobs" / args.job).is_dir()
                                                       else [args.job])
    if unknown:
        p.error(f"unknown: {', '.join(unknown)} (candidates: {', '.join(CANDIDATES)}; jobs: examples/jobs)")
    names = ["portable", *[n for n in names if n != "portable"]]
    results = {}
    for name in names:
        env = {**os.environ, **PORTABLE_KERNELS, **CANDIDATES[name][0], TRACE_ENV: "1", "OMP_NUM_THREADS": "1"}
        print(f"{name}: {CANDIDATES[name][2]}", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--job", args.job, "--steps", str(args.steps),
                               "--workdir", str(wd)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{name} failed (exit {proc.returncode}); its error is above")
        trace = read(wd / name / TRACE_FILE)
        if name == "portable":
            reference = trace
            results[name] = {"score": trace[-1]["score"], "differences": []}
        else:
            results[name] = {"score": trace[-1]["score"], "differences": compare(reference, trace)}
        diffs = results[name]["differences"]
        print(f"  hidden score {trace[-1]['score']:.3f}; " + ("the same trace as portable" if not diffs and
                                                                name != "portable" else ""), flush=True)
        for line in diffs:
            print("  " + line, flush=True)
    C.write(args.json, "kernel_suspects", {"job": args.job, "steps": args.steps, "candidates": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
