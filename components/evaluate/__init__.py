"""evaluate: tuned vs base on held-out data (loss, generations, optional lm-eval tasks) with a quality gate."""
