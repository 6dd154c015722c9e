"""One inner training job: spec (schema, validation, cost), run (the pipeline, cache, executors, worker),
isolation (launcher, sandbox, reward host), train (data, rewards, TRL runners) and models. Never imports
outer_loop."""
