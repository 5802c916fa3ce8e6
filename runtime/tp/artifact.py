"""The tensor-parallel artifact: one directory holding the N ranks' shards.

::

    NAME.ingot/
      manifest.json          format, version, target, mode "llm", source, llm, kv_cache (one rank's), and
                             "tp": {size, ranks: ["rank0", ...], num_heads, num_kv_heads, head_dim,
                             kv_heads_per_rank, sharding, lm_head}; "files": the sha256 of EVERY file below,
                             the ranks' included
      tokenizer.json ...     the tokenizer files, once
      rank0/                 a complete single-rank artifact (runtime/artifact.py) of rank 0's graph:
        manifest.json        its graph (with all_reduce ops), kv_cache (its KV heads), cuda kernel table
        weights.safetensors  its shard (replicated weights included, so each rank loads one file)
        kernels/             GPU targets: its kernels
      rank1/ ...

Each rank's directory is an ordinary artifact with its own checksums, so a rank process loads its
shard with the ordinary loaders; ``load_tp`` first checks the top-level list, which covers every
file. Writing is atomic like ``write_artifact``: everything goes to a temporary sibling renamed into
place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...ir.graph import Graph
from ..artifact import (
    MANIFEST,
    ArtifactError,
    _replace_dir,
    checksums,
    copy_files,
    load_graph,
    manifest_header,
    read_manifest,
    verify_checksums,
    write_artifact,
)


def rank_dir(rank: int) -> str:
    return f"rank{rank}"


def tp_size(manifest: Mapping[str, Any]) -> int:
    """The tensor-parallel size an artifact's manifest records (1 for an ordinary artifact)."""
    tp = manifest.get("tp")
    return int(tp["size"]) if isinstance(tp, dict) else 1


def is_tp_artifact(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not (p / MANIFEST).is_file():
        return False
    try:
        return tp_size(json.loads((p / MANIFEST).read_text())) > 1
    except (OSError, ValueError):
        return False


def write_tp_artifact(
    graphs: Sequence[Graph],
    out: str | os.PathLike,
    *,
    target: str,
    source: dict[str, Any],
    files: Mapping[str, Path] | None = None,
    rank_files: Sequence[Mapping[str, Path]] | None = None,
    rank_manifests: Sequence[Mapping[str, Any]] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Write the ranks' graphs (``passes/tp_shard.py``, rank order) as one TP artifact at ``out``.

    ``files``: shared extra files (the tokenizer); ``rank_files`` / ``rank_manifests``: each rank's
    extra files and manifest entries (its GPU kernels and ``cuda`` entry)."""
    size = len(graphs)
    if size < 2:
        raise ArtifactError("a tensor-parallel artifact needs at least 2 ranks")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for r, g in enumerate(graphs):
            extra = dict(rank_manifests[r]) if rank_manifests else {}
            write_artifact(g, tmp / rank_dir(r), target=target, mode="llm", source=source,
                           extra_files=dict(rank_files[r]) if rank_files else None,
                           extra_manifest={"kv_cache": g.meta["kv_cache"], "llm": g.meta["llm"], "tp": g.meta["tp"],
                                           **extra},
                           progress=(lambda s, d, t, r=r: progress(f"weights (rank {r})", d, t)) if progress else None)
        copy_files(tmp, files)
        info = dict(graphs[0].meta["tp"])  # type: ignore[arg-type]
        nh, kv = int(info["num_heads"]), int(info["num_kv_heads"])
        manifest: dict[str, Any] = {
            **manifest_header(source, target, "llm"),
            "tp": {
                "size": size,
                "ranks": [rank_dir(r) for r in range(size)],
                "num_heads": nh,
                "num_kv_heads": kv,
                "head_dim": int(info["head_dim"]),
                "kv_heads_per_rank": kv // size,
                "sharding": "megatron: qkv and gate_up column-parallel, o_proj and down row-parallel + all_reduce; "
                            "rank r holds query heads [r*NH/N, (r+1)*NH/N) and KV heads [r*KV/N, (r+1)*KV/N)",
                "lm_head": "replicated (every rank computes the logits; rank 0's are used)",
                "embedding": "replicated",
            },
            "kv_cache": json.loads(json.dumps(graphs[0].meta["kv_cache"])),
            "llm": json.loads(json.dumps(graphs[0].meta["llm"])),
            "files": checksums(tmp),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def verify_tp_files(path: Path, manifest: Mapping[str, Any]) -> None:
    """Every file the top-level manifest lists exists with its sha256, and every rank's manifest is listed."""
    files = manifest.get("files")
    tp = manifest.get("tp")
    if not isinstance(files, dict) or not isinstance(tp, dict):
        raise ArtifactError(f"{path / MANIFEST}: the tp entry or the file list is missing")
    for r in range(int(tp["size"])):
        if f"{rank_dir(r)}/{MANIFEST}" not in files:
            raise ArtifactError(f"{path / MANIFEST}: rank {r}'s manifest is not in the file list")
    verify_checksums(path, files)


def read_tp_manifest(path: str | os.PathLike, check: bool = True) -> dict[str, Any]:
    """The top-level manifest of a TP artifact (every file's checksum verified when ``check``)."""
    path = Path(path)
    manifest = read_manifest(path)
    if tp_size(manifest) < 2:
        raise ArtifactError(f"{path}: not a tensor-parallel artifact (no tp entry with size >= 2)")
    if check:
        verify_tp_files(path, manifest)
    return manifest


def load_rank(path: str | os.PathLike, rank: int, check: bool = False) -> tuple[Graph, dict[str, Any]]:
    """Rank ``rank``'s graph and manifest (its own directory; ``check`` re-verifies that directory's files,
    which ``load_tp`` already covered)."""
    path = Path(path)
    graph, manifest = load_graph(path / rank_dir(rank), check=check)
    tp = manifest.get("tp")
    if not isinstance(tp, dict) or int(tp.get("rank", -1)) != rank:
        raise ArtifactError(f"{path / rank_dir(rank)}: its manifest does not say it is rank {rank}")
    return graph, manifest


def load_tp(path: str | os.PathLike, check: bool = True) -> tuple[Graph, dict[str, Any]]:
    """Rank 0's graph and the manifest the engine reads (rank 0's, with the top-level ``tp`` entry and
    file list): what ``load_graph`` is for an ordinary artifact."""
    top = read_tp_manifest(path, check=check)
    graph, manifest = load_rank(path, 0)
    return graph, {**manifest, "tp": top["tp"], "files": top["files"], "rank0": manifest.get("files")}
