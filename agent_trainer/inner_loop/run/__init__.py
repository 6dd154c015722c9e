"""One job end to end in the harness: run_job, its result.json, the job cache, executors and launchers, and the
worker that runs the training process."""
