"""tilewise.optim: optimizers and learning-rate schedules with torch.optim's names, defaults and numerics."""

from tilewise.optim import lr_scheduler
from tilewise.optim.adam import Adam, AdamW
from tilewise.optim.optimizer import Optimizer
from tilewise.optim.rmsprop import Adagrad, RMSprop
from tilewise.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler"]
