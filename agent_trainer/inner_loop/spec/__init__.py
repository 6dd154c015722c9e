"""What a job is before it runs: the job.yaml schema, what a job folder may hold, the validation and its dry-run
probe, the estimated cost."""
