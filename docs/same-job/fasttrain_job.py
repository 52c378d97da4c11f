import torch
from torch import nn

import fasttrain

x = torch.randn(1024, 8)  # your data: float inputs, float targets
y = torch.sin(x.sum(1))
net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1), nn.Flatten(0))
run = fasttrain.build(model=net, data=(x, y), loss=nn.functional.mse_loss, epochs=20,
                      val_fraction=0.1, early_stop="val_loss", precision="bf16", out="runs/mine")
fasttrain.fit(run)
trained = fasttrain.load("runs/mine", model=net)
