"""The KV of prompt prefixes kept after they are computed once: a saved voice's prefix (its reference codes
and transcript, SPEC D1) is prefilled once and copied into a take's KV slot from then on, across takes (in
memory) and across restarts (on disk, where a directory is given).

What a prefix's KV bits depend on, all in the entry's identity, so an entry is only ever used where a cold
prefill would have computed the very same bits (engine/runner.py `Runner.plan`: the prefix is prefilled in
the same chunks whether or not it was cached):
- the prompt prefix itself: its ids and a digest of its reference rows (`Prompt.cache_key`). A voice whose
  clip or transcript changed is another key, so a stale entry can never match;
- the checkpoint (its path and each weight file's size and modification time), the precision and the
  prefill scheme (`HiggsModel.prefill_scheme`);
- the kernels: torch's version, its CPU kernel level and the thread count (a GEMM's summation order
  depends on them).

Every prefix a take computes is kept in memory; only a warmed one (`Engine.warm_voice`, a saved voice) is
written to disk.

Cost: 2 · layers · kv_heads · head_dim · 2 bytes per position in bf16 (147 KB at full size; a 10 s clip's
prefix of ~300 positions is ~44 MB), in memory up to `budget` bytes (least recently used first out), on
disk one file per prefix.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

import torch

# Memory kept for prefixes by default: about a dozen full-size voices.
DEFAULT_BUDGET = 512 << 20


def checkpoint_fingerprint(root) -> str:
    """The checkpoint's path and each weight file's name, size and modification time."""
    root = Path(root)
    files = sorted(p for p in root.glob("*.safetensors")) if root.is_dir() else []
    parts = [str(root.resolve())] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return "|".join(parts)


def kv_bytes(kv) -> int:
    return sum(t.numel() * t.element_size() for pair in kv for t in pair)


class PrefixStore:
    """Prefix KV by key (`engine.runner.prefix_key`), for one model. `identity` names what the bits depend
    on besides the kernels (checkpoint, precision, prefill scheme); `directory` keeps entries across
    restarts (None: memory only)."""

    def __init__(self, identity: str, directory: str | Path | None = None, budget: int = DEFAULT_BUDGET):
        self.identity, self.budget = identity, budget
        self.directory = Path(directory) if directory is not None else None
        self.entries: OrderedDict[str, list] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = self.loads = 0  # what tests and the benchmark read

    def name(self, key) -> str:
        """The entry's file name: a digest of the key and everything its bits depend on."""
        kernels = (torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
        return hashlib.sha256(repr((self.identity, kernels, key)).encode()).hexdigest()

    def get(self, key):
        """The prefix's KV [(keys, values) per layer], or None. A disk entry is read into memory."""
        if key is None:
            return None
        name = self.name(key)
        with self.lock:
            kv = self.entries.get(name)
            if kv is not None:
                self.entries.move_to_end(name)
                self.hits += 1
                return kv
        kv = self._read(name)
        with self.lock:
            if kv is None:
                self.misses += 1
                return None
            self.loads += 1
            self._keep(name, kv)
        return kv

    def has(self, key) -> bool:
        if key is None:
            return False
        name = self.name(key)
        with self.lock:
            if name in self.entries:
                return True
        return self.directory is not None and (self.directory / f"{name}.pt").exists()

    def put(self, key, kv, persist: bool = False) -> None:
        """Keep `kv` (tensors this store now owns) for `key` in memory and, with `persist` and a directory,
        on disk (a saved voice's prefix; a one-off clip's stays in memory)."""
        name = self.name(key)
        with self.lock:
            self._keep(name, kv)
        if persist and self.directory is not None and not (self.directory / f"{name}.pt").exists():
            self._write(name, kv)

    def forget(self) -> None:
        with self.lock:
            self.entries.clear()

    def _keep(self, name: str, kv) -> None:  # with self.lock held
        self.entries[name] = kv
        self.entries.move_to_end(name)
        while len(self.entries) > 1 and sum(kv_bytes(v) for v in self.entries.values()) > self.budget:
            self.entries.popitem(last=False)

    def _write(self, name: str, kv) -> None:
        """Written beside and renamed into place, so a reader never sees half a file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.pt"
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        torch.save({"name": name, "kv": [t for pair in kv for t in pair]}, tmp)
        os.replace(tmp, path)

    def _read(self, name: str):
        if self.directory is None:
            return None
        path = self.directory / f"{name}.pt"
        try:
            data = torch.load(path, weights_only=True)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 (whatever a damaged file raises, it is a miss, and goes)
            path.unlink(missing_ok=True)
            return None
        flat = data.get("kv") if isinstance(data, dict) and data.get("name") == name else None
        if not flat or len(flat) % 2:
            return None
        return list(zip(flat[0::2], flat[1::2]))


__all__ = ["DEFAULT_BUDGET", "PrefixStore", "checkpoint_fingerprint", "kv_bytes"]
