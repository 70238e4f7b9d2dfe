"""A checkpoint's own account of what it holds, read on the control machine before a byte of it is copied.

A Hugging Face checkpoint says what it is made of: its index (``model.safetensors.index.json``) names every shard,
and each shard's safetensors header gives the shard's length (8 bytes holding the header's size, the JSON header,
then the tensors, up to the end of the last one's ``data_offsets``). :func:`check_source` reads a model's cache
directory as ``hf download`` leaves it (``models--ORG--NAME``: ``refs/main``, ``snapshots/<revision>/``, the blobs)
and names each shard the index names that is not there, and each shard whose size is not the length its own header
gives (a copy cut short). Reading costs a directory listing and the first bytes of each shard, never the shards: a
source is checked before the stage copies anything from it (:mod:`k3deploy.runtime.gather`), so a source missing a
shard refuses the run instead of failing the first node after the image and part of the weights were copied.
An image archive (``docker save``) is read the same way, by its listing: :func:`check_archive`.

Example::

    >>> import json, struct
    >>> header = json.dumps({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    >>> length(struct.pack("<Q", len(header)) + header) == 8 + len(header) + 4
    True
    >>> length(b"\\x10\\x00"), length(struct.pack("<Q", 80) + b'{"w": ')
    (None, None)
    >>> index_shards('{"weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}')
    ['m-1.safetensors', 'm-2.safetensors']
    >>> Shard("m-2.safetensors", None, None).why, Shard("m-1.safetensors", 100, 4096).why
    ('missing', 'cut short: 100 bytes, its header gives 4096')
"""

from __future__ import annotations

import json
import os
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

#: the index Hugging Face checkpoints of several shards carry
INDEX = "model.safetensors.index.json"
#: a safetensors header is at most this long (the format's own limit)
HEADER_MAX = 100 * 1024 * 1024


def length(head: bytes) -> int | None:
    """The length of a safetensors file, from its first bytes (at least the 8-byte size and the header it gives):
    8 + the header + the end of the last tensor. None: the bytes do not hold a whole, valid header."""
    if len(head) < 8:
        return None
    size: int = struct.unpack("<Q", head[:8])[0]
    if size > HEADER_MAX or len(head) < 8 + size:
        return None
    try:
        header = json.loads(head[8:8 + size])
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    ends = [0]
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return None
        ends.append(int(offsets[1]))
    return 8 + size + max(ends)


def index_shards(text: str) -> list[str]:
    """The shards an index names (its ``weight_map``'s values), sorted, each once. Raises ``ValueError`` for text
    that is no index."""
    doc = json.loads(text)
    weights = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(v, str) for v in weights.values()):
        raise ValueError("no weight_map of shard names")
    return sorted(set(weights.values()))


def _header_length(path: Path) -> int | None:
    """The length ``path``'s safetensors header gives (None: no whole header there)."""
    with path.open("rb") as f:
        first = f.read(8)
        if len(first) < 8:
            return None
        size: int = struct.unpack("<Q", first)[0]
        return length(first + f.read(min(size, HEADER_MAX)))


@dataclass(frozen=True)
class Shard:
    """One shard as the source holds it: its size (None: not there) and the length its header gives (None: no
    whole header)."""

    name: str
    size: int | None
    want: int | None

    @property
    def why(self) -> str | None:
        """What is wrong with it (None: nothing)."""
        if self.size is None:
            return "missing"
        if self.want is None:
            return f"cut short or rotten: {self.size} bytes, no whole safetensors header"
        if self.size < self.want:
            return f"cut short: {self.size} bytes, its header gives {self.want}"
        if self.size > self.want:
            return f"{self.size} bytes, its header gives {self.want}"
        return None


@dataclass(frozen=True)
class SourceCheck:
    """What a model's cache directory holds against what its checkpoint names (:func:`check_source`)."""

    source: str
    revision: str | None = None
    shards: tuple[Shard, ...] = ()
    error: str | None = None     # the directory is no snapshot the check can read (no index, no refs/main, ...)

    @property
    def bad(self) -> list[Shard]:
        return [s for s in self.shards if s.why is not None]

    @property
    def missing(self) -> list[str]:
        return [s.name for s in self.shards if s.size is None]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.bad

    def problem(self) -> str:
        """What is wrong, in a few words ('' when nothing is): the missing shards first, then the short ones."""
        if self.error is not None:
            return self.error
        bad = self.bad
        if not bad:
            return ""
        missing = self.missing
        parts = [f"{len(missing)} of its {len(self.shards)} shards missing ({', '.join(missing)})"] if missing else []
        parts += [f"{s.name} {s.why}" for s in bad if s.size is not None]
        return "; ".join(parts)


def check_source(source: str) -> SourceCheck:
    """Read the model cache directory ``source`` (``models--ORG--NAME``) as a stage would copy it: the snapshot
    ``refs/main`` names, its index, and each shard the index names (or, without an index, each ``*.safetensors``
    file): there, and as long as its header says."""
    root = Path(source)
    try:
        revision = (root / "refs" / "main").read_text().strip()
    except OSError:
        return SourceCheck(source, error="no refs/main: not a model's Hugging Face cache directory")
    snapshot = root / "snapshots" / revision
    if not revision or not snapshot.is_dir():
        return SourceCheck(source, revision or None, error=f"refs/main names the snapshot {revision!r}, which is "
                                                           "not there")
    index = snapshot / INDEX
    if index.exists():
        try:
            names = index_shards(index.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return SourceCheck(source, revision, error=f"its index {INDEX} cannot be read ({exc})")
    else:
        names = sorted(p.name for p in snapshot.glob("*.safetensors"))
        if not names:
            return SourceCheck(source, revision, error=f"no {INDEX} and no *.safetensors file in its snapshot")
    shards = []
    for name in names:
        path = snapshot / name
        try:
            size = path.stat().st_size     # through the snapshot's link to the blob: a dangling link is missing
        except OSError:
            shards.append(Shard(name, None, None))
            continue
        try:
            want = _header_length(path)
        except OSError:
            want = None
        shards.append(Shard(name, size, want))
    return SourceCheck(source, revision, tuple(shards))


def check_archive(path: str) -> str | None:
    """What is wrong with the ``docker save`` archive ``path``, read from its listing (None: nothing): a tar whose
    every member lies whole within the file, with a ``manifest.json`` naming at least one image, whose config and
    layers are members. Reading it walks the members' headers (each seeks over its data), never the layers."""
    try:
        size = os.path.getsize(path)
        with tarfile.open(path, "r:") as tar:
            members: dict[str, tarfile.TarInfo] = {}
            for m in tar:
                if m.isfile() and m.offset_data + m.size > size:
                    return f"{m.name} cut short: the file ends at byte {size}, the member at {m.offset_data + m.size}"
                members[m.name] = m
            manifest = members.get("manifest.json")
            got = tar.extractfile(manifest) if manifest is not None and manifest.isfile() else None
            if got is None:
                return "no manifest.json (cut short?)"
            entries = json.loads(got.read())
    except (OSError, tarfile.TarError) as exc:
        return f"cut short or not a tar archive ({exc})"
    except (UnicodeDecodeError, ValueError) as exc:
        return f"its manifest.json cannot be read ({exc})"
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        return "its manifest.json names no image"
    named = [p for e in entries for p in [e.get("Config"), *(e.get("Layers") or [])]]
    lacking = [str(p) for p in named if not isinstance(p, str) or p not in members]
    if lacking:
        return f"{len(lacking)} of the files its manifest.json names missing ({', '.join(lacking)})"
    return None
