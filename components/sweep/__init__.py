"""sweep-grid and select-best: the components a hyperparameter sweep adds around tune-and-evaluate."""
