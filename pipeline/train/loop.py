"""The training loop: optimiser and lr schedule per config, seeds, AMP on CUDA, per-epoch
checkpoints with resume, checkpoint selection on the val split, S-MiT's second phase,
evaluation on the test split, metrics.json and curve.png."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.config import TrainConfig
from pipeline.models.device import pick_device
from pipeline.corpus.storage import Corpus
from pipeline.train import losses
from pipeline.train.batches import BatchOptions, GroupBatchSampler, collate, concat_candidates, epoch_rng
from pipeline.train.checkpoint import UnsafeCheckpoint, load_checkpoint
from pipeline.train.evaluation import (EvalOn, encode_all, evaluate_model, evaluation_pairs, mean_recall,
                                       similarity_matrix, to_device)
from pipeline.train.feed import feed_for, held_out
from pipeline.train.metrics import retrieval_metrics
from pipeline.train.models import SMIT, Encoded, RetrievalModel, build_model
from pipeline.train.pairs import PairSet, PairsError
from pipeline.train.schedule import LrSchedule, finetune_schedule, schedule_for
from pipeline.train.stream import PairStream

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
BEST = "best.pt"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def batch_options(cfg: TrainConfig) -> BatchOptions:
    """How training batches are drawn: the papers' train-time sampling on features (WAL and
    AsyNCE: N_f = 5 frames; S-MiT: 10 words per caption; MIL-NCE: a random window of
    `options.window` frames; pixel augmentation needs pixels and is not done on features)."""
    o = cfg.options
    fam = cfg.model
    return BatchOptions(
        window=o.get("window"),
        n_frames=o.get("n_frames", 5 if fam in ("wal", "asynce") else None),
        n_words=o.get("n_words", 10 if fam in SMIT else None),
        word_repeat=bool(o.get("word_repeat", True)),
        wal=fam == "wal" and o.get("lvc_loss", "bce") == "bce",
        candidates=int(o.get("candidates", 5)) if fam == "milnce" else 0,
    )


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               nesterov=bool(cfg.options.get("nesterov", cfg.model == "asynce")))
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)


def discriminator_frozen(model: RetrievalModel, cfg: TrainConfig, epoch: int) -> bool:
    """WAL 5.3: for the first `freeze_epochs` (50) epochs the discriminator channel is fixed and
    its gradients stopped; the model then trains as WAL-att alone (no z, no L_ADV)."""
    return model.discriminator is not None and epoch < int(cfg.options.get("freeze_epochs", 50))


def compute_loss(model: RetrievalModel, batch: dict[str, torch.Tensor], cfg: TrainConfig, step: int,
                 epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The family's loss on one batch and extra stats (WAL-att-adv: the z=0 count)."""
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
        if model.discriminator is None or discriminator_frozen(model, cfg, epoch):
            return losses.wal_lvc_bce(lvc_logit, labels), stats
        adv_logit, z = model.discriminator(F.normalize(text.emb, dim=-1), p_lvc)
        stats["z0"] = float((z < 0.5).sum())
        stats["n"] = float(len(z))
        return losses.wal_adv_pair(lvc_logit, adv_logit, labels, z), stats
    if fam == "milnce":
        return _milnce_loss(model, batch, video.emb, cfg), stats
    if fam == "order":
        return losses.max_margin(model.similarity(video, text), cfg.margin, "sum", o.get("direction", "v2t")), stats
    if fam == "asynce":
        if o.get("loss", "asynce") == "nce":  # the symmetric baseline on the same towers
            return losses.nce(model.similarity(video, text), cfg.temperature), stats
        return losses.asynce(model.word_sim(video, text), text.mask, video.mask, delta=cfg.margin,
                             temperature=cfg.temperature, entity=o.get("entity", "soft"),
                             frame=o.get("frame", "soft")), stats
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


def _milnce_loss(model: RetrievalModel, batch: dict[str, torch.Tensor], video: torch.Tensor,
                 cfg: TrainConfig) -> torch.Tensor:
    """MIL-NCE (eq. 1) or one of its baselines (4.3, appendix A) on a batch of candidate bags."""
    variant = cfg.options.get("variant", "mil")
    cand, words, mask = batch["cand"], batch["cand_words"], batch["cand_mask"]
    if variant == "cat":  # the candidates' words as one narration through the text tower
        narration = model.encode_text(*concat_candidates(cand, words, mask)).emb
        return losses.milnce(video, narration[:, None], None, cfg.temperature)
    emb = model.encode_candidates(cand, words)
    if variant == "attn":
        attention = model.candidate_attention(batch["visual"], batch["visual_mask"], cand, words)
        return losses.attn_nce(video, emb, attention, mask, cfg.temperature)
    if variant == "max":
        return losses.max_nce(video, emb, mask, cfg.temperature)
    if variant == "mil":
        return losses.milnce(video, emb, mask, cfg.temperature)
    raise ValueError(f"MIL-NCE variant must be 'mil', 'max', 'attn' or 'cat', got {variant!r}")


@torch.no_grad()
def validation_score(model: RetrievalModel, val: PairSet, cfg: TrainConfig, device: torch.device, step: int,
                     epoch: int) -> float:
    """Higher is better: minus the training loss on the val split (batches and draws fixed
    across epochs), or the mean of R@1/5/10 over both directions."""
    if cfg.select == "val_recall":
        return mean_recall(retrieval_metrics(similarity_matrix(model, val, device)))
    model.eval()
    rng = epoch_rng(cfg.seed, 0, 2)
    sampler = GroupBatchSampler(val.groups, min(cfg.batch_size, len(val)), cfg.seed)
    values = [float(compute_loss(model, to_device(collate(val, idx, batch_options(cfg), rng), device), cfg, step,
                                 epoch)[0]) for idx in sampler.batches(0)]
    if not values:
        raise PairsError(f"the val split has {len(val)} pairs: too few for a batch")
    return -float(np.mean(values))


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


def selected_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint training picked: best.pt beside the newest epoch when the run selected
    one on the val split, else the newest epoch (a .pt file given is used as it is)."""
    latest = latest_checkpoint(path)
    if latest is None or Path(path).is_file():
        return latest
    best = latest.parent / BEST
    return best if best.exists() else latest


def _resumable(latest: Path | None, dev: torch.device) -> dict[str, Any] | None:
    """The newest checkpoint's state to resume from; None to start over, also when that file is
    refused (it holds more than weights: training starts over and replaces it)."""
    if latest is None:
        return None
    try:
        return load_checkpoint(latest, dev)
    except UnsafeCheckpoint as exc:
        log.warning("%s; training starts over", exc)
        return None


def _save(path: Path, state: dict[str, Any]) -> None:
    # All or nothing: resume loads the newest epoch_*.pt, so a kill mid-save must not leave a
    # truncated one (nor a temporary file beside it).
    with Corpus(str(path.parent)).atomic_file(path.name) as handle:
        torch.save(state, handle)


@torch.no_grad()
def _init_background(model: RetrievalModel, train: PairSet, device: torch.device, seed: int) -> None:
    assert model.discriminator is not None
    video, _ = encode_all(model, train, device)
    emb = video.emb if video.emb.ndim == 2 else _mean_frames(video)
    gen = torch.Generator().manual_seed(seed)
    model.discriminator.init_background(emb.cpu(), gen)


def _mean_frames(video: Encoded) -> torch.Tensor:
    w = video.mask.to(video.emb.dtype)[..., None]
    return (video.emb * w).sum(1) / w.sum(1).clamp_min(1)


def _phase_schedule(cfg: TrainConfig, epoch: int) -> LrSchedule:
    return finetune_schedule(cfg) if epoch >= cfg.epochs else schedule_for(cfg)


def train(pairs: PairSet | PairStream, cfg: TrainConfig, out_dir: Path, device: str = "auto", resume: bool = True,
          eval_on: EvalOn = "test", source: str | None = None) -> dict[str, Any]:
    """Train `cfg.model` on the train split, checkpoint every epoch into
    out_dir/checkpoints (resuming from the newest when `resume`), keep the best epoch on the
    val split when `cfg.select` asks (best.pt), run S-MiT's second phase when `cfg.finetune`,
    evaluate the selected model on the test split and write out_dir/metrics.json and
    out_dir/curve.png. Returns the metrics dict, with the config and the data it trained on
    (`source`: where the pairs came from, as the report shows it). Pairs streamed from a corpus
    (`PairStream`) select and evaluate on a bounded sample of their val and test splits."""
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / CHECKPOINT_DIR
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device(pick_device(device, "--device"))
    seed_everything(cfg.seed)
    feed = feed_for(pairs, cfg, eval_on)
    held = feed.held
    evaluation_pairs(held, eval_on)  # no test split: fail before training, not after
    val = held.subset("val")
    selecting = cfg.select != "last" and len(val) >= 2
    model = build_model(cfg, held.visual_dim, held.text_dim).to(dev)
    opt = make_optimizer(model, cfg, cfg.lr)
    use_amp = dev.type == "cuda"
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    start_epoch, step, curve, best = 0, 0, [], None
    latest = latest_checkpoint(ckpt_dir) if resume else None
    state = _resumable(latest, dev)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state.get("scaler", {})) if state.get("scaler") else None
        start_epoch, step, curve, best = state["epoch"] + 1, state["step"], state["curve"], state.get("best")
        torch.set_rng_state(state["rng"]["torch"])
        if torch.cuda.is_available() and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        log.info("resumed from %s at epoch %d", latest, start_epoch)
    else:
        # A previous run's pick, and its epochs: one beyond this run's last would stay the newest.
        for old in [ckpt_dir / BEST, *_checkpoints(ckpt_dir)]:
            old.unlink(missing_ok=True)
        if model.discriminator is not None:  # a stream reads its sample only for WAL-att-adv
            _init_background(model, feed.background(), dev, cfg.seed)
    opts = batch_options(cfg)
    clip = cfg.options.get("grad_clip", 2.0 if cfg.model in ("order", "max_margin") else None)
    total_epochs = cfg.epochs * (2 if cfg.finetune else 1)
    for epoch in range(start_epoch, total_epochs):
        if cfg.finetune and epoch == cfg.epochs:
            # S-MiT appendix B: the second round starts from the first round's selected parameters.
            if best is not None:
                model.load_state_dict(load_checkpoint(ckpt_dir / BEST, dev)["model"])
            opt = make_optimizer(model, cfg, finetune_schedule(cfg).base)
        schedule = _phase_schedule(cfg, epoch)
        model.train()
        total, n_batches, z0, zn = 0.0, 0, 0.0, 0.0
        lr = schedule(step, epoch)
        for batch in feed.batches(epoch, opts):
            lr = schedule.apply(opt, step, epoch)
            batch = to_device(batch, dev)
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
        point: dict[str, Any] = {"epoch": epoch, "loss": total / max(n_batches, 1), "lr": lr}
        if model.discriminator is not None:
            point["z0_share"] = z0 / zn if zn else None  # None while the discriminator is frozen
        state = {
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "epoch": epoch, "step": step, "curve": curve,
            "config": cfg.model_dump(mode="json"),
            "visual_dim": held.visual_dim, "text_dim": held.text_dim,
        }
        if selecting:
            point["val"] = validation_score(model, val, cfg, dev, step, epoch)
            if best is None or point["val"] > best["value"]:
                best = {"by": cfg.select, "epoch": epoch, "value": point["val"]}
                _save(ckpt_dir / BEST, {**state, "best": best})
        curve.append(point)
        log.info("epoch %d: %s", epoch, point)
        state["best"] = best
        state["rng"] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        _save(ckpt_dir / f"epoch_{epoch:04d}.pt", state)
    if best is not None:
        model.load_state_dict(load_checkpoint(ckpt_dir / BEST, dev)["model"])
    result = evaluate_model(model, held, dev, cfg.seed, cfg.eval_protocol, eval_on)
    result["selected"] = best or {"by": "last", "epoch": total_epochs - 1,
                                  **({} if cfg.select == "last" else {"note": f"no val split: {cfg.select} "
                                                                              f"needs 2 val pairs"})}
    result["curve"] = curve
    result["config"] = cfg.model_dump(mode="json")
    result["data"] = {"source": source, "visual_dim": held.visual_dim, "text_dim": held.text_dim,
                      "pairs": feed.counts()}
    if isinstance(pairs, PairStream):
        result["data"]["streamed"] = {"held_out_per_split": cfg.stream.held_out}
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


def evaluate(checkpoint_dir: str | Path, pairs: PairSet | PairStream, device: str = "auto",
             eval_on: EvalOn = "test") -> dict[str, Any]:
    """Metrics of the checkpoint training selected under `checkpoint_dir` (a training dir or
    its checkpoints dir: best.pt when the run picked one on the val split, else the newest
    epoch; or one .pt file) on the test split of `pairs`."""
    path = selected_checkpoint(checkpoint_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint (epoch_*.pt) under {checkpoint_dir}")
    dev = torch.device(pick_device(device, "--device"))
    state = load_checkpoint(path, dev)
    cfg = TrainConfig.model_validate(state["config"])
    pairs = held_out(pairs, cfg, eval_on)
    if (pairs.visual_dim, pairs.text_dim) != (state["visual_dim"], state["text_dim"]):
        raise ValueError(f"{path} was trained on visual/text dims {state['visual_dim']}/{state['text_dim']}, "
                         f"the pairs have {pairs.visual_dim}/{pairs.text_dim}")
    model = build_model(cfg, state["visual_dim"], state["text_dim"]).to(dev)
    model.load_state_dict(state["model"])
    out = evaluate_model(model, pairs, dev, cfg.seed, cfg.eval_protocol, eval_on)
    out["checkpoint"] = str(path)
    out["epoch"] = state["epoch"]
    return out
