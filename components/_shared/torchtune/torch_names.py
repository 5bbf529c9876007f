"""The public optimizers and learning-rate schedulers of torch, as plain data: the launcher and pre-flight steps
check a `_component_` path that names one (torch.optim.AdamW) without torch, which the component image does not
have. tests/components/_shared/torchtune/test_component_paths.py checks this table against the installed torch
(the `train` extra's range, torch>=2.9,<2.14); a name newer than the trainer image's torch is still refused where
training runs (torch_checks.validate_config imports it).
"""

# torch.optim: the classes deriving from torch.optim.Optimizer (the base class itself excluded).
OPTIMIZERS = frozenset(
    {
        "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon", "NAdam", "RAdam",
        "RMSprop", "Rprop", "SGD", "SparseAdam",
    }
)  # fmt: skip

# torch.optim.lr_scheduler: the scheduler classes it defines (the LRScheduler base class excluded).
LR_SCHEDULERS = frozenset(
    {
        "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
        "ExponentialLR", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR", "PolynomialLR",
        "ReduceLROnPlateau", "SequentialLR", "StepLR",
    }
)  # fmt: skip

# The modules these tables describe, by dotted name.
MODULES = {"torch.optim": OPTIMIZERS, "torch.optim.lr_scheduler": LR_SCHEDULERS}
