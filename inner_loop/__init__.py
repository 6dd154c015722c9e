"""The inner job: schema, validation, TRL runners, rewards, data, tiny models. Never imports outer_loop."""
