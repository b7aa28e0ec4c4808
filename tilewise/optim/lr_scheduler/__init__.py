"""Learning-rate schedules (torch.optim.lr_scheduler); see [Note: learning-rate schedules] in ``base.py``."""

from tilewise.optim.lr_scheduler.base import EPOCH_DEPRECATION_WARNING, LRScheduler, _LRScheduler
from tilewise.optim.lr_scheduler.combined import ChainedScheduler, SequentialLR
from tilewise.optim.lr_scheduler.cyclic import CyclicLR, OneCycleLR
from tilewise.optim.lr_scheduler.plateau import ReduceLROnPlateau
from tilewise.optim.lr_scheduler.schedules import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    StepLR,
)

__all__ = ["LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
           "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
           "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR", "LRScheduler", "_LRScheduler",
           "EPOCH_DEPRECATION_WARNING"]
