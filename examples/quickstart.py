"""A torch-style training loop in tilewise: the README's example, runnable as ``python examples/quickstart.py``."""

import tilewise as tw
from tilewise import nn
from tilewise.utils.data import DataLoader, TensorDataset

tw.manual_seed(0)
x = tw.randn(2048, 2)
y = (x[:, 0] * x[:, 1] > 0).long()  # label: same-sign quadrants
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)

model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = tw.optim.AdamW(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(10):
    for xb, yb in loader:
        loss = loss_fn(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")

tw.save(model.state_dict(), "quickstart.safetensors")
