"""Moving tensors and weights between tilewise and PyTorch (needs ``torch``): DLPack shares memory, state
dicts and safetensors checkpoints carry weights both ways.

    python examples/torch_interop.py
"""

import numpy as np
import torch

import tilewise as tw

# DLPack: zero-copy in both directions
t = tw.arange(6.0).view(2, 3)
x = torch.from_dlpack(t)  # a torch view of tilewise's memory
x[0, 0] = 100.0
print("tilewise sees torch's write:", t[0, 0].item())
back = tw.from_dlpack(torch.linspace(0, 1, 5))
print("torch tensor as tilewise:", back.tolist())

# the same model in both frameworks: torch's weights into tilewise, then compare outputs
ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
model = tw.nn.Sequential(tw.nn.Linear(4, 8), tw.nn.GELU(), tw.nn.Linear(8, 2))
model.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})
inputs = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
difference = np.abs(model(tw.tensor(inputs)).detach().numpy() - ref(torch.tensor(inputs)).detach().numpy()).max()
print(f"largest output difference, tilewise vs torch: {difference:.2e}")

# checkpoints are safetensors files, readable by torch's safetensors loader
tw.save(model.state_dict(), "interop.safetensors")
from safetensors.torch import load_file  # noqa: E402

ref.load_state_dict(load_file("interop.safetensors"))
print("torch loaded tilewise's checkpoint:", sorted(load_file("interop.safetensors")))
