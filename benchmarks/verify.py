"""What hashing every file of the weights again costs: the check the deploy runs before an engine starts and
``k3deploy verify`` runs on demand (:func:`k3deploy.model.commands.check_snapshot`), on this machine's cores.

Writes N GiB of shard-like files (``--gib``, default 4: shards of ``--shard-mib`` MiB of random bytes, plus a
``config.json`` and the index, blobs named by their sha256 or git blob id) in a temporary Hugging Face cache layout,
runs the real script under ``sh`` and prints the throughput, the seconds per TB of checkpoint and per TB per core
(the script hashes one file per CPU, so a node with C cores and enough shards takes about that figure / C, until
its disks are the bound). ``--cold`` drops the files from the page cache first (``posix_fadvise``, these files
only), so the disk is read too; by default they are in the page cache, which measures the hashing itself.

Run: python benchmarks/verify.py [--gib 4] [--shard-mib 512] [--cold] [--runs 2] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k3deploy.model import commands  # noqa: E402

MODEL = "org/bench"


def write_cache(root: Path, gib: float, shard_mib: int) -> int:
    """The cache of one model, ``gib`` GiB of shards; returns the bytes written."""
    d = Path(commands.model_dir(str(root), MODEL))
    blobs, snap = d / "blobs", d / "snapshots/bench"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "refs/main").write_text("bench")
    total = int(gib * 1024**3)
    count = max(1, -(-total // (shard_mib * 1024**2)))
    names = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    chunk = os.urandom(8 * 1024**2)
    written = 0
    for i, name in enumerate(names):
        size = min(shard_mib * 1024**2, total - i * shard_mib * 1024**2)
        h = hashlib.sha256()
        part = blobs / f"{name}.part"
        with open(part, "wb") as f:
            left, salt = size, i.to_bytes(8, "little")
            while left > 0:
                piece = (salt + chunk)[:min(left, len(chunk) + 8)]
                f.write(piece)
                h.update(piece)
                left -= len(piece)
        part.rename(blobs / h.hexdigest())
        (snap / name).symlink_to(f"../../blobs/{h.hexdigest()}")
        written += size
    small = {"config.json": b'{"model_type": "kimi_k3"}\n',
             "model.safetensors.index.json": json.dumps({"weight_map": {f"t{i}": n for i, n in
                                                                        enumerate(names)}}).encode()}
    for name, data in small.items():
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (blobs / blob).write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/{blob}")
        written += len(data)
    return written


def drop_from_page_cache(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="GiB of shards to write and hash (default 4)")
    ap.add_argument("--shard-mib", type=int, default=512, help="size of one shard in MiB (default 512)")
    ap.add_argument("--cold", action="store_true", help="drop the files from the page cache before each run")
    ap.add_argument("--runs", type=int, default=2, help="runs of the check (the best is reported)")
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="k3-verify-", dir=args.dir))
    try:
        t = time.monotonic()
        size = write_cache(root, args.gib, args.shard_mib)
        wrote = time.monotonic() - t
        script = commands.check_snapshot(str(root), MODEL)
        best = None
        for _ in range(args.runs):
            if args.cold:
                drop_from_page_cache(root)
            t = time.monotonic()
            proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
            seconds = time.monotonic() - t
            if proc.returncode != 0:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            best = seconds if best is None else min(best, seconds)
        assert best is not None
        cores = os.cpu_count() or 1
        gbps = size / best / 1e9
        per_tb = 1e12 / (size / best)
        tool = "openssl" if subprocess.run(["sh", "-c", "openssl dgst -sha256 -r </dev/null"],
                                           capture_output=True).returncode == 0 else "sha256sum"
        result = {"bytes": size, "files": len(list((Path(commands.model_dir(str(root), MODEL)) / "blobs")
                                                   .iterdir())),
                  "seconds": round(best, 2), "gb_per_s": round(gbps, 3), "s_per_tb": round(per_tb),
                  "s_per_tb_per_core": round(per_tb * cores), "cores": cores, "cold": args.cold, "tool": tool,
                  "write_seconds": round(wrote, 1)}
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"{size / 1024**3:.1f} GiB in {result['files']} files, {cores} cores, {tool}, "
                  f"{'cold (read from disk)' if args.cold else 'in the page cache'}: {best:.2f} s = "
                  f"{gbps:.2f} GB/s; {per_tb:.0f} s per TB ({per_tb / 60:.1f} min), "
                  f"{per_tb * cores:.0f} s per TB per core")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
