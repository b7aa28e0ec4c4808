"""tilewise.optim: optimizers and learning-rate schedules with torch.optim's names, defaults and numerics."""

from tilewise.optim import lr_scheduler, swa_utils
from tilewise.optim.adadelta import Adadelta
from tilewise.optim.adafactor import Adafactor
from tilewise.optim.adagrad import Adagrad
from tilewise.optim.adam import Adam, AdamW
from tilewise.optim.adamax import Adamax
from tilewise.optim.asgd import ASGD
from tilewise.optim.lbfgs import LBFGS
from tilewise.optim.muon import Muon
from tilewise.optim.nadam import NAdam
from tilewise.optim.optimizer import Optimizer, register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from tilewise.optim.radam import RAdam
from tilewise.optim.rmsprop import RMSprop
from tilewise.optim.rprop import Rprop
from tilewise.optim.sgd import SGD
from tilewise.optim.sparse_adam import SparseAdam

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop",
           "LBFGS", "lr_scheduler", "register_optimizer_step_pre_hook", "register_optimizer_step_post_hook", "ASGD",
           "Rprop", "Adafactor", "Muon", "SparseAdam", "swa_utils"]
