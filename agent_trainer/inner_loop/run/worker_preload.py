"""Imported once by the warm-worker forkserver (``agent_trainer.inner_loop.run.worker``): the slow libraries of a job.

Imports only: no torch operation runs here, so forked job processes start with no thread pool.
"""

import warnings

# With the gpu extra, ``import trl`` warns five times that its tested vllm range ends below the installed
# one; a job's stderr (and at-job's one-line errors) should not carry that.
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")

import datasets  # noqa: E402, F401
import peft  # noqa: E402, F401
import torch  # noqa: E402, F401
import transformers  # noqa: E402, F401
import trl  # noqa: E402, F401
from trl import DPOTrainer, GRPOTrainer, SFTTrainer  # noqa: E402, F401
# The architecture of the tiny models (and of Qwen3-0.6B/1.7B): ``AutoModelForCausalLM`` imports it
# lazily on first use, ~3 s that every forked job would pay again.
from transformers import Qwen3ForCausalLM  # noqa: E402, F401

import agent_trainer.inner_loop.train.data  # noqa: E402, F401
import agent_trainer.inner_loop.train.rewards  # noqa: E402, F401
import agent_trainer.inner_loop.train  # noqa: E402, F401
import agent_trainer.inner_loop.train.stages  # noqa: E402, F401
