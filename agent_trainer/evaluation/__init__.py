"""The harness side: task families, hidden sets, scoring, baselines, staged reward. Never imports outer_loop or
inner_loop."""
