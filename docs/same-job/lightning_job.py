import csv

import lightning as L
import matplotlib.pyplot as plt
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

x = torch.randn(1024, 8)
y = torch.sin(x.sum(1))
net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1), nn.Flatten(0))


class Module(L.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def training_step(self, batch, _):
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, _):
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.0)


train, val = random_split(TensorDataset(x, y), [0.9, 0.1], torch.Generator().manual_seed(0))
logger, best = CSVLogger("runs/mine-lightning"), ModelCheckpoint(monitor="val_loss")
trainer = L.Trainer(max_epochs=20, precision="bf16-mixed", logger=logger, log_every_n_steps=1,
                    callbacks=[EarlyStopping("val_loss", patience=3), best])
trainer.fit(Module(net), DataLoader(train, batch_size=64, shuffle=True), DataLoader(val, 256))
with open(f"{logger.log_dir}/metrics.csv") as f:
    steps = [r for r in csv.DictReader(f) if r["train_loss"]]
plt.plot([float(r["train_loss"]) for r in steps])
plt.savefig(f"{logger.log_dir}/loss.png")
trained = Module.load_from_checkpoint(best.best_model_path, net=net).net
