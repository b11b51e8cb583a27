"""The `train` section: the papers' defaults and the checks against the features section."""

import pytest

from pipeline.config import ConfigError, TrainConfig, parse_config

BASE = {"name": "x", "sources": [{"type": "urls", "urls": ["http://127.0.0.1/a"]}],
        "features": {"extractors": [{"name": "resnet152", "fps": 1}, {"name": "tsm_r50"},
                                    {"name": "text:bart", "keep_tokens": True}]}}


def test_several_visual_extractors_are_checked_one_by_one():
    cfg = parse_config({**BASE, "train": {"model": "amm", "visual": ["resnet152", "tsm_r50"], "text": "text:bart"}})
    assert cfg.train.visual_names == ["resnet152", "tsm_r50"]
    with pytest.raises(ConfigError, match="'s3d' is not in features.extractors"):
        parse_config({**BASE, "train": {"model": "amm", "visual": ["resnet152", "s3d"], "text": "text:bart"}})


def test_paper_defaults():
    smit = TrainConfig(model="amm", visual="v", text="t")
    assert (smit.select, smit.finetune, smit.eval_protocol) == ("val_recall", True, "subsets")
    assert TrainConfig(model="order", visual="v", text="t").select == "val_loss"
    milnce = TrainConfig(model="milnce", visual="v", text="t")
    assert (milnce.warmup_steps, milnce.lr_milestones) == (5000, [60, 80])
    wal = TrainConfig(model="wal", visual="v", text="t")
    assert (wal.epochs, wal.lr_milestones, wal.lr_step) == (70, [60], None)
    # a schedule the config gives replaces the paper's
    assert TrainConfig(model="wal", visual="v", text="t", lr_step=15).lr_milestones is None
