"""Imported once by the warm-worker forkserver (``inner_loop.worker``): the slow libraries of a job.

Imports only: no torch operation runs here, so forked job processes start with no thread pool.
"""

import datasets  # noqa: F401
import peft  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401
import trl  # noqa: F401
from trl import DPOTrainer, GRPOTrainer, SFTTrainer  # noqa: F401
# The architecture of the tiny models (and of Qwen3-0.6B/1.7B): ``AutoModelForCausalLM`` imports it
# lazily on first use, ~3 s that every forked job would pay again.
from transformers import Qwen3ForCausalLM  # noqa: F401

import inner_loop.data  # noqa: F401
import inner_loop.rewards  # noqa: F401
import inner_loop.runners  # noqa: F401
import inner_loop.runners.stages  # noqa: F401
