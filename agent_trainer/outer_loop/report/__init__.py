"""Reading runs back: at-compare's tables and plots, seed reports, bootstrap intervals."""
