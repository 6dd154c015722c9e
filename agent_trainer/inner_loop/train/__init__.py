"""Inside the job's process: its rows (data), rewards, self-generated data and the TRL runners (GRPO, SFT, DPO).

TRL runners for inner jobs: GRPO, SFT and DPO, full or LoRA, with budget/divergence guards.

    >>> from agent_trainer.inner_loop.train.train import train
    >>> report = train(spec, rows, rewards, model_path, "job/output", max_steps=200)

A whole job (its stages, self-generated data, DPO pairs, the ``ran`` record) goes through
``agent_trainer.inner_loop.train.stages.run_stages``, which calls ``train`` once per stage.

Run them in the worker process (``python -m agent_trainer.inner_loop.run.worker``), never in the harness: they
execute the job's reward code. ``agent_trainer.inner_loop.run.job.run_job`` does that for you.

Nothing is imported here (the runners pull in torch and transformers); their names live in their modules:
``agent_trainer.inner_loop.train.callbacks``: BudgetGuard, StepLog
``agent_trainer.inner_loop.train.config``: lora_config, planned_steps, trl_config
``agent_trainer.inner_loop.train.train``: MODEL_DIR, TRAIN_LOG, TRL_CONFIG, TrainReport, build_trainer, save_checkpoint,
    train
"""
