"""Learning-rate schedules of the papers: step decays at given epochs (WAL's ÷10 "in later
epochs", MIL-NCE's two ÷10 decays) after an optional linear warm-up (MIL-NCE: 5k steps)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
import torch

from pipeline.config import TrainConfig


@dataclass(frozen=True)
class LrSchedule:
    """lr(step, epoch) = base · min(1, (step + 1) / warmup_steps) · gamma^(number of milestones <= epoch).

    A pure function of (step, epoch), so a resumed run continues on the same curve."""

    base: float
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    warmup_steps: int = 0

    def __call__(self, step: int, epoch: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        return self.base * warm * self.gamma ** bisect_right(sorted(self.milestones), epoch)

    def apply(self, optimizer: torch.optim.Optimizer, step: int, epoch: int) -> float:
        lr = self(step, epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr


def schedule_for(cfg: TrainConfig) -> LrSchedule:
    """The first phase's schedule of a `TrainConfig`: lr_milestones, or every lr_step epochs."""
    if cfg.lr_milestones is not None:
        milestones = tuple(cfg.lr_milestones)
    elif cfg.lr_step:
        milestones = tuple(range(cfg.lr_step, cfg.epochs, cfg.lr_step))
    else:
        milestones = ()
    return LrSchedule(cfg.lr, milestones, cfg.lr_gamma, cfg.warmup_steps)


def finetune_schedule(cfg: TrainConfig) -> LrSchedule:
    """S-MiT's second phase (appendix B): a fixed learning rate of its own."""
    return LrSchedule(cfg.finetune_lr or cfg.lr)
