"""The K capability adapters a composed model is built from: checks, hashes, and their LoRA weights.

Stage four of TRACE (docs/design.md "Composer") takes the PEFT LoRA adapters that ``trace train`` wrote, one
per capability, all on the same base. This module resolves them (``name=dir`` or a plain folder),
refuses what cannot be composed (another base, other target modules, DoRA, LoRA biases, whole modules
saved) with a message that says what to do, and reads each adapted projection's ``A`` and ``B``
(``B`` pre-scaled by ``alpha / r``) through PEFT itself, so that rank and alpha patterns, rsLoRA and
PEFT's key naming are read exactly as PEFT reads them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

#: Folders that hold a model's weights, hashed to pin a composed model to its exact base and adapters.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
_BLOCK_RE = re.compile(r"^model\.layers\.(\d+)\.")
_GENERIC_NAMES = {"adapter", "final", "best", "lora"}


class ComposeError(ValueError):
    """Adapters or a composed folder that cannot be used as asked; the message says how to fix it."""


@dataclass
class AdapterRef:
    """One capability adapter: its name (the expert's label), folder, content hash and PEFT config."""

    name: str
    path: Path
    sha256: str
    config: dict

    def as_json(self) -> dict:
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256}


def folder_digest(path: str | Path, names: Iterable[str] | None = None) -> str:
    """SHA-256 over a model or adapter folder's config and weight files (names and bytes, sorted)."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file() and (
        p.suffix in _WEIGHT_SUFFIXES or p.name in ("config.json", "adapter_config.json")))
    if names is not None:
        wanted = set(names)
        files = [p for p in files if p.name in wanted]
    if not files:
        raise ComposeError(f"{path}: no weight files (*.safetensors / *.bin) to hash")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def default_adapter_name(path: Path) -> str:
    """The expert's name from its folder: ``train/<capability>/adapter`` names ``<capability>``."""
    from trace_train.train.fold import ON_BASE

    path = path.resolve()
    if path.name == ON_BASE:  # a checkpoint folded onto the base (trace_train/train/fold.py): the checkpoint's name
        path = path.parent
    name = path.name
    if name in _GENERIC_NAMES or name.startswith("checkpoint-"):
        name = path.parent.name
    return name


def resolve_adapters(adapters: Mapping[str, Any] | Iterable[Any]) -> list[AdapterRef]:
    """Adapters as :class:`AdapterRef` s, in the given order (expert k = slot k + 1).

    Args:
        adapters: folders (``str`` / ``Path``), ``"name=folder"`` strings, or a ``{name: folder}`` mapping.
    """
    items: list[tuple[str, Path]] = []
    if isinstance(adapters, Mapping):
        items = [(str(k), Path(v)) for k, v in adapters.items()]
    else:
        for a in adapters:
            text = str(a)
            if "=" in text and not Path(text).exists():
                name, folder = text.split("=", 1)
                items.append((name, Path(folder)))
            else:
                items.append((default_adapter_name(Path(text)), Path(text)))
    if not items:
        raise ComposeError("no adapters given; pass at least one PEFT LoRA adapter folder")
    refs = []
    for name, folder in items:
        cfg_file = folder / "adapter_config.json"
        if not cfg_file.is_file():
            raise ComposeError(f"{folder} is not a PEFT adapter folder (no adapter_config.json); pass the folder "
                               "`trace train` wrote (its adapter_dir) or one saved with PeftModel.save_pretrained")
        config = json.loads(cfg_file.read_text())
        if config.get("peft_type", "LORA") != "LORA":
            raise ComposeError(f"{folder}: a {config.get('peft_type')} adapter; only LoRA adapters can be composed")
        for key, why in (("use_dora", "DoRA rescales the whole weight"), ("lora_bias", "a LoRA bias"),):
            if config.get(key):
                raise ComposeError(f"{folder}: {key}=True ({why}) cannot be routed per token; train the adapter "
                                   f"without {key}")
        if config.get("modules_to_save"):
            raise ComposeError(f"{folder}: modules_to_save={config['modules_to_save']} replaces whole modules, which "
                               "cannot be mixed per token; train the adapter without modules_to_save")
        refs.append(AdapterRef(name, folder.resolve(), folder_digest(folder), config))
    names = [r.name for r in refs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ComposeError(f"two adapters are named {', '.join(dupes)}; name them with NAME=DIR")
    return refs


def check_same_base(base_path: Path, base_digest: str, refs: list[AdapterRef]) -> None:
    """Refuse an adapter whose recorded base folder exists and holds other weights than ``base_path``."""
    for ref in refs:
        recorded = ref.config.get("base_model_name_or_path")
        if not recorded:
            continue
        rp = Path(recorded)
        if rp.is_dir() and rp.resolve() != base_path.resolve():
            try:
                same = folder_digest(rp) == base_digest
            except ComposeError:
                continue
            if not same:
                raise ComposeError(f"adapter {ref.name!r} was trained on {rp}, whose weights differ from the base "
                                   f"{base_path}; compose adapters of one base only")


def block_of(module_name: str) -> int:
    """The transformer block index of an adapted module (``model.layers.3.self_attn.q_proj`` -> 3)."""
    m = _BLOCK_RE.match(module_name)
    if m is None:
        raise ComposeError(f"adapted module {module_name!r} is outside the transformer blocks; the composer routes "
                           "per block, so train the adapters on the blocks' projections only")
    return int(m.group(1))


def extract_experts(base: Any, refs: list[AdapterRef]):
    """Read every adapter's LoRA weights off ``base`` through PEFT; return ``(plain base, experts)``.

    ``experts`` maps each adapted module name (relative to the causal LM, e.g.
    ``model.layers.0.self_attn.q_proj``) to a list of K ``(A, B_scaled)`` pairs, where ``A`` is
    ``(r, in)`` and ``B_scaled = scaling * B`` is ``(out, r)``. The base comes back without LoRA layers.
    """
    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    keys = [f"e{i}" for i in range(len(refs))]
    try:
        peft_model = PeftModel.from_pretrained(base, str(refs[0].path), adapter_name=keys[0])
        for key, ref in zip(keys[1:], refs[1:]):
            peft_model.load_adapter(str(ref.path), adapter_name=key)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ComposeError(f"the adapters do not fit this base model ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:300]}); compose adapters trained on this base") from exc
    per_adapter: list[dict[str, tuple]] = [{} for _ in refs]
    prefix = "base_model.model."
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            rel = name[len(prefix):] if name.startswith(prefix) else name
            for i, key in enumerate(keys):
                if key in module.lora_A:
                    a = module.lora_A[key].weight.detach().clone()
                    b = module.lora_B[key].weight.detach().clone() * module.scaling[key]
                    per_adapter[i][rel] = (a, b)
    sets = [set(d) for d in per_adapter]
    for ref, s in zip(refs[1:], sets[1:]):
        if s != sets[0]:
            only_first = sorted(sets[0] - s)[:3]
            only_this = sorted(s - sets[0])[:3]
            raise ComposeError(f"adapter {ref.name!r} adapts other modules than {refs[0].name!r} (only in "
                               f"{refs[0].name!r}: {only_first or '-'}; only in {ref.name!r}: {only_this or '-'}); "
                               "train every adapter with the same target_modules")
    if not sets[0]:
        raise ComposeError(f"adapter {refs[0].name!r} adapts no module of this base")
    experts = {name: [d[name] for d in per_adapter] for name in sorted(sets[0])}
    for name in experts:
        block_of(name)
    plain = peft_model.unload()
    return plain, experts


def adapter_update_is_zero(path: str | Path) -> bool:
    """Whether a LoRA adapter changes nothing: in every adapted module ``A`` or ``B`` is exactly zero.

    PEFT starts ``B`` at zero, and GRPO whose every group was flat (all rewards equal, no advantage) never
    moves it, so such an adapter computes exactly the base's function (``W x + 0``). False for a folder
    without ``adapter_model.safetensors`` or with anything besides LoRA matrices (it cannot be sure).
    """
    from safetensors import safe_open

    weights = Path(path) / "adapter_model.safetensors"
    if not weights.is_file():
        return False
    pairs: dict[str, dict[str, bool]] = {}
    with safe_open(str(weights), framework="pt") as f:
        for key in f.keys():
            side = "A" if ".lora_A." in key else "B" if ".lora_B." in key else None
            if side is None:
                return False  # biases, embeddings or whole modules saved: not a pure low-rank update
            module = key.split(f".lora_{side}.")[0]
            pairs.setdefault(module, {})[side] = not bool(f.get_tensor(key).any())
    return bool(pairs) and all(sides.get("A", False) or sides.get("B", False) for sides in pairs.values())
