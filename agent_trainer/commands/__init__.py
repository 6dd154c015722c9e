"""Thin entry points: one @hydra.main per at-* command, each calling a plain run(cfg)."""
