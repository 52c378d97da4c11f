import json
import os

import matplotlib.pyplot as plt
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

x = torch.randn(1024, 8)
y = torch.sin(x.sum(1))
net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1), nn.Flatten(0))
train, val = random_split(TensorDataset(x, y), [0.9, 0.1], torch.Generator().manual_seed(0))
acc = Accelerator(mixed_precision="bf16")
opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
model, opt, train_dl, val_dl = acc.prepare(net, opt, DataLoader(train, 64, shuffle=True),
                                           DataLoader(val, 256))
out, best, waited, losses = "runs/mine-accelerate", float("inf"), 0, []
os.makedirs(out, exist_ok=True)
for epoch in range(20):
    model.train()
    for xb, yb in train_dl:
        loss = nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        val_loss = sum(nn.functional.mse_loss(model(xb), yb).item() * len(yb)
                       for xb, yb in val_dl) / len(val)
    with open(f"{out}/metrics.jsonl", "a") as f:
        f.write(json.dumps({"epoch": epoch, "val_loss": val_loss}) + "\n")
    if val_loss < best:
        best, waited = val_loss, 0
        acc.save_state(f"{out}/best")
    elif (waited := waited + 1) >= 3:
        break
plt.plot(losses)
plt.savefig(f"{out}/loss.png")
acc.load_state(f"{out}/best")
trained = acc.unwrap_model(model)
