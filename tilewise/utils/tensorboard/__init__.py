"""tilewise.utils.tensorboard: ``SummaryWriter`` writing TensorBoard event files, as ``torch.utils.tensorboard``."""

from tilewise.utils.tensorboard.writer import FileWriter, SummaryWriter

__all__ = ["FileWriter", "SummaryWriter"]
