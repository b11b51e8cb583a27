"""The training loop: optimiser and schedule per config, seeds, AMP on CUDA, per-epoch
checkpoints with resume, evaluation on the test split, metrics.json and curve.png."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.train import losses, metrics
from pipeline.train.data import BatchOptions, GroupBatchSampler, PairSet, PairsError, collate, epoch_rng, full_batches
from pipeline.train.models import RetrievalModel, build_model

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def batch_options(cfg: Any) -> BatchOptions:
    o = cfg.options
    fam = cfg.model
    return BatchOptions(
        n_frames=o.get("n_frames", 5 if fam in ("wal", "asynce") else None),
        n_words=o.get("n_words", 10 if fam in ("nce", "mms", "amm", "shn") else None),
        word_repeat=bool(o.get("word_repeat", True)),
        wal=fam == "wal" and o.get("lvc_loss", "bce") == "bce",
        candidates=int(o.get("candidates", 5)) if fam == "milnce" else 0,
    )


def make_optimizer(model: torch.nn.Module, cfg: Any) -> tuple[torch.optim.Optimizer, Any]:
    params = [p for p in model.parameters()]
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                              nesterov=bool(cfg.options.get("nesterov", cfg.model == "asynce")))
    elif cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.StepLR(opt, cfg.lr_step, cfg.lr_gamma) if cfg.lr_step else None
    return opt, sched


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def compute_loss(model: RetrievalModel, batch: dict[str, torch.Tensor], cfg: Any, step: int,
                 epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The family's loss on one batch and extra stats (WAL: z0 count)."""
    fam, o = cfg.model, cfg.options
    video = model.encode_video(batch["visual"], batch["visual_mask"])
    text = model.encode_text(batch["text"], batch["text_mask"])
    stats: dict[str, float] = {}
    if fam == "wal":
        if "labels" not in batch:  # triplet ablation: hardest negative, margin 0.2
            return losses.max_margin(model.similarity(video, text), cfg.margin, reduction="max"), stats
        p_lvc = model.paired_scores(video, text)
        lvc_logit = model.f_lvc(p_lvc[:, None]).squeeze(-1)
        labels = batch["labels"]
        if model.discriminator is None:
            return losses.wal_lvc_bce(lvc_logit, labels), stats
        frozen = epoch < int(o.get("freeze_epochs", 50))
        for p in model.discriminator.parameters():
            p.requires_grad_(not frozen)
        adv_logit, z = model.discriminator(text.emb, p_lvc)
        stats["z0"] = float((z < 0.5).sum())
        stats["n"] = float(len(z))
        return losses.wal_adv_pair(lvc_logit, adv_logit, labels, z), stats
    if fam == "milnce":
        cand = model.encode_candidates(batch["cand"], batch["cand_words"])
        variant = o.get("variant", "mil")
        fn = {"mil": losses.milnce, "max": losses.max_nce, "attn": losses.attn_nce, "cat": losses.cat_nce}[variant]
        return fn(video.emb, cand, batch["cand_mask"], cfg.temperature), stats
    if fam == "order":
        return losses.order_ranking(video.emb, text.emb, cfg.margin, o.get("direction", "v2t")), stats
    if fam == "asynce":
        return losses.asynce(model.word_sim(video, text), text.mask, delta=cfg.margin, temperature=cfg.temperature,
                             positive=o.get("positive", "frame")), stats
    sim = model.similarity(video, text)
    if fam == "nce":
        return losses.nce(sim, cfg.temperature), stats
    if fam == "mms":
        sched = losses.MarginSchedule(initial=cfg.margin, factor=float(o.get("margin_factor", 1.002)),
                                      every=int(o.get("margin_every", 1000)))
        return losses.mms(sim, sched(step), cfg.temperature), stats
    if fam == "amm":
        return losses.amm(sim, float(o.get("alpha", 0.5)), cfg.temperature, bool(o.get("detach_margin", True))), stats
    if fam == "shn":
        return losses.shn(sim, cfg.margin), stats
    if fam == "max_margin":
        return losses.max_margin(sim, cfg.margin, o.get("reduction", "sum"), o.get("direction", "both")), stats
    raise ValueError(f"unknown model family {fam!r}")


@torch.no_grad()
def encode_all(model: RetrievalModel, pairs: PairSet, device: torch.device, batch_size: int = 256):
    """Video and text encodings of every pair, padded to one length per side."""
    model.eval()
    vids, texts = [], []
    for batch in full_batches(pairs, batch_size):
        batch = _to(batch, device)
        vids.append(model.encode_video(batch["visual"], batch["visual_mask"]))
        texts.append(model.encode_text(batch["text"], batch["text_mask"]))
    return _cat(vids), _cat(texts)


def _cat(parts):
    from pipeline.train.models import Encoded
    if parts[0].emb.ndim == 2:
        return Encoded(torch.cat([p.emb for p in parts]))
    length = max(p.emb.shape[1] for p in parts)
    emb = torch.cat([F.pad(p.emb, (0, 0, 0, length - p.emb.shape[1])) for p in parts])
    mask = torch.cat([F.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts])
    return Encoded(emb, mask)


@torch.no_grad()
def similarity_matrix(model: RetrievalModel, pairs: PairSet, device: torch.device, chunk: int = 64) -> np.ndarray:
    """S [N_text, N_video] of the pairs (text i belongs to video i), texts scored in chunks."""
    video, text = encode_all(model, pairs, device)
    rows = [model.similarity(video, text.index(slice(i, i + chunk))).float().cpu()
            for i in range(0, len(pairs), chunk)]
    return torch.cat(rows).numpy()


def evaluate_model(model: RetrievalModel, pairs: PairSet, device: torch.device, seed: int = 0) -> dict[str, Any]:
    """Retrieval metrics on the test split (or on all pairs when none is marked test)."""
    test = pairs.subset("test") if "test" in pairs.splits else pairs
    if len(test) < 2:
        raise PairsError(f"evaluation needs at least 2 test pairs, got {len(test)}")
    sim = similarity_matrix(model, test, device)
    if len(test) >= 1000:
        out: dict[str, Any] = metrics.subset_protocol(sim, seed=seed)
        out["protocol"] = "subsets_5x1000"
    else:
        out = metrics.retrieval_metrics(sim)
        out["protocol"] = f"fixed_{len(test)}"
    try:
        out["mc_acc"] = metrics.multiple_choice(sim, video_ids=test.groups, seed=seed)
    except ValueError:
        out["mc_acc"] = None
    out["n_test"] = len(test)
    out["split"] = "test" if test is not pairs else "all"
    return out


# ---------------------------------------------------------------- checkpoints


def _checkpoints(directory: Path) -> list[Path]:
    return sorted(directory.glob("epoch_*.pt"))


def latest_checkpoint(path: str | Path) -> Path | None:
    """The newest checkpoint under a training dir, a checkpoints dir, or the file itself."""
    path = Path(path)
    if path.is_file():
        return path
    for d in (path / CHECKPOINT_DIR, path):
        found = _checkpoints(d) if d.is_dir() else []
        if found:
            return found[-1]
    return None


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


@torch.no_grad()
def _init_background(model: RetrievalModel, train: PairSet, device: torch.device, seed: int) -> None:
    if model.discriminator is None:
        return
    video, _ = encode_all(model, train, device)
    emb = video.emb if video.emb.ndim == 2 else _mean_frames(video)
    gen = torch.Generator().manual_seed(seed)
    model.discriminator.init_background(emb.cpu(), gen)


def _mean_frames(video) -> torch.Tensor:
    w = video.mask.to(video.emb.dtype)[..., None]
    return (video.emb * w).sum(1) / w.sum(1).clamp_min(1)


def train(pairs: PairSet, cfg: Any, out_dir: Path, device: str = "auto", resume: bool = True) -> dict[str, Any]:
    """Train `cfg.model` (a `TrainConfig`) on the train split, checkpoint every epoch into
    out_dir/checkpoints (resuming from the newest when `resume`), evaluate on the test split
    and write out_dir/metrics.json and out_dir/curve.png. Returns the metrics dict."""
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / CHECKPOINT_DIR
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    dev = pick_device(device)
    seed_everything(cfg.seed)
    train_set = pairs.subset("train")
    if len(train_set) < 2:
        raise PairsError(f"training needs at least 2 train pairs, got {len(train_set)}")
    model = build_model(cfg, pairs.visual_dim, pairs.text_dim).to(dev)
    opt, sched = make_optimizer(model, cfg)
    use_amp = dev.type == "cuda"
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    start_epoch, step, curve = 0, 0, []
    latest = latest_checkpoint(ckpt_dir) if resume else None
    if latest is not None:
        state = torch.load(latest, map_location=dev, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if sched is not None and state.get("scheduler"):
            sched.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state.get("scaler", {})) if state.get("scaler") else None
        start_epoch, step, curve = state["epoch"] + 1, state["step"], state["curve"]
        torch.set_rng_state(state["rng"]["torch"])
        if torch.cuda.is_available() and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        log.info("resumed from %s at epoch %d", latest, start_epoch)
    else:
        _init_background(model, train_set, dev, cfg.seed)
    sampler = GroupBatchSampler(train_set.groups, min(cfg.batch_size, len(train_set)), cfg.seed)
    opts = batch_options(cfg)
    clip = cfg.options.get("grad_clip", 2.0 if cfg.model in ("order", "max_margin") else None)
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        rng = epoch_rng(cfg.seed, epoch)
        total, n_batches, z0, zn = 0.0, 0, 0.0, 0.0
        for idx in sampler.batches(epoch):
            batch = _to(collate(train_set, idx, opts, rng), dev)
            with torch.autocast(dev.type, dtype=amp_dtype, enabled=use_amp):
                loss, stats = compute_loss(model, batch, cfg, step, epoch)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
            scaler.step(opt)
            scaler.update()
            total += float(loss.detach())
            n_batches += 1
            step += 1
            z0 += stats.get("z0", 0.0)
            zn += stats.get("n", 0.0)
        if sched is not None:
            sched.step()
        point: dict[str, Any] = {"epoch": epoch, "loss": total / max(n_batches, 1)}
        if cfg.model == "wal" and model.discriminator is not None:
            point["z0_share"] = z0 / zn if zn else None
        curve.append(point)
        log.info("epoch %d: %s", epoch, point)
        _save(ckpt_dir / f"epoch_{epoch:04d}.pt", {
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict() if sched is not None else None,
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "epoch": epoch, "step": step, "curve": curve,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "config": cfg.model_dump(mode="json") if hasattr(cfg, "model_dump") else dict(cfg),
            "visual_dim": pairs.visual_dim, "text_dim": pairs.text_dim,
        })
    result = evaluate_model(model, pairs, dev, cfg.seed)
    result["curve"] = curve
    result["device"] = dev.type
    # Float sums split over threads round differently, so CPU runs match at equal thread counts.
    result["torch_threads"] = torch.get_num_threads()
    write_outputs(out_dir, result)
    return result


def write_outputs(out_dir: Path, result: dict[str, Any]) -> None:
    out_dir = Path(out_dir)
    (out_dir / "metrics.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curve = result.get("curve") or []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["epoch"] for p in curve], [p["loss"] for p in curve], marker="o", label="loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    zs = [(p["epoch"], p["z0_share"]) for p in curve if p.get("z0_share") is not None]
    if zs:
        ax2 = ax.twinx()
        ax2.plot(*zip(*zs), color="tab:orange", marker="s", label="z=0 share")
        ax2.set_ylabel("share of pairs with z=0")
        ax2.set_ylim(0, 1)
    ax.set_title("training curve")
    fig.tight_layout()
    fig.savefig(out_dir / "curve.png", dpi=100)
    plt.close(fig)


def evaluate(checkpoint_dir: str | Path, pairs: PairSet, device: str = "auto") -> dict[str, Any]:
    """Metrics of the newest checkpoint under `checkpoint_dir` (a training dir, its
    checkpoints dir, or one .pt file) on the test split of `pairs`."""
    from pipeline.config import TrainConfig

    path = latest_checkpoint(checkpoint_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint (epoch_*.pt) under {checkpoint_dir}")
    dev = pick_device(device)
    state = torch.load(path, map_location=dev, weights_only=False)
    cfg = TrainConfig.model_validate(state["config"])
    if (pairs.visual_dim, pairs.text_dim) != (state["visual_dim"], state["text_dim"]):
        raise ValueError(f"{path} was trained on visual/text dims {state['visual_dim']}/{state['text_dim']}, "
                         f"the pairs have {pairs.visual_dim}/{pairs.text_dim}")
    model = build_model(cfg, state["visual_dim"], state["text_dim"]).to(dev)
    model.load_state_dict(state["model"])
    out = evaluate_model(model, pairs, dev, cfg.seed)
    out["checkpoint"] = str(path)
    out["epoch"] = state["epoch"]
    return out
