"""The artifact: a directory ``NAME.ingot/`` that a runtime loads without executing any code.

::

    NAME.ingot/
      manifest.json        format version, source hash, target, mode, the graph (text IR),
                           signature, weight index, sha256 of every other file
      weights.safetensors  every weight, by the graph's weight names

Writing goes to a temporary sibling directory that is renamed into place at the end, so a failed
compile leaves nothing behind and an existing artifact is replaced only by a complete one. Loading
checks the format version and every file's sha256 and names the file that is wrong; the graph is
parsed from its text form (never unpickled or evaluated).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..ir.graph import Graph, Weight
from ..ir.text import parse_graph, print_graph
from ..ir.types import TensorType
from ..ir.verify import verify
from . import safetensors_io

FORMAT = "ingot-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


class ArtifactError(ValueError):
    """The artifact is missing, malformed, tampered with or of another format version."""


class GraphSignature:
    """``inputs`` / ``outputs`` as (name, type) pairs, for the loaded-model classes that hold a ``graph``."""

    graph: Graph

    @property
    def inputs(self) -> list[tuple[str, str]]:
        return [(v.name, str(v.type)) for v in self.graph.inputs]

    @property
    def outputs(self) -> list[tuple[str, str]]:
        return [(n, str(v.type)) for v, n in zip(self.graph.outputs, self.graph.output_names)]


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _signature(values: list, names: list[str] | None = None) -> list[dict[str, Any]]:
    names = names or [v.name for v in values]
    return [
        {"name": n, "dtype": v.type.dtype.value, "shape": None if v.type.shape is None else list(v.type.shape)}
        for v, n in zip(values, names)
    ]


def write_artifact(
    graph: Graph,
    out: str | os.PathLike,
    *,
    target: str,
    mode: str,
    source: dict[str, Any],
    extra_files: dict[str, Path] | None = None,
    extra_manifest: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Write ``graph`` as an artifact at ``out`` atomically. Returns the artifact path.

    ``progress(step, done_bytes, total_bytes)`` is called while weights are written.
    """
    verify(graph)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        weights = graph.weights
        total = sum((w.type.numel() or 0) * w.type.dtype.np.itemsize for w in weights.values())
        done = 0

        def on_tensor(name: str, nbytes: int) -> None:
            nonlocal done
            done += nbytes
            weights[name].release()
            if progress is not None:
                progress("weights", done, total)

        entries = []
        for name, w in weights.items():
            if not w.type.is_static:
                raise ArtifactError(f"weight {name!r} has a non-static type {w.type}")
            entries.append((name, (w.type.dtype, tuple(int(d) for d in w.type.shape)), w.load))  # type: ignore
        safetensors_io.write(tmp / WEIGHTS, entries, metadata={"format": "ingot"}, progress=on_tensor)
        copy_files(tmp, extra_files)
        files = checksums(tmp)
        manifest: dict[str, Any] = {
            **manifest_header(source, target, mode),
            "inputs": _signature(graph.inputs),
            "outputs": _signature(graph.outputs, graph.output_names),
            "weights": {
                name: {"dtype": w.type.dtype.value, "shape": list(w.type.shape or ())}
                for name, w in weights.items()
            },
            "graph": print_graph(graph),
            "meta": graph.meta,
            **(extra_manifest or {}),
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def copy_files(dst_dir: Path, files: dict[str, Path] | None) -> None:
    """Copy ``files`` (path inside the artifact -> source file) into ``dst_dir``."""
    for rel, src in (files or {}).items():
        dst = dst_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def checksums(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root``, by its posix path relative to ``root``."""
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def manifest_header(source: Any, target: str, mode: str) -> dict[str, Any]:
    """The fields every manifest starts with: format, versions, creation time, source, target, mode."""
    from .. import __version__

    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "ingot_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "source": source,
        "target": target,
        "mode": mode,
    }


def _replace_dir(new: Path, dst: Path) -> None:
    """Move ``new`` to ``dst``; an existing ``dst`` is replaced only once ``new`` is complete."""
    if dst.exists() or dst.is_symlink():
        if not (dst / MANIFEST).exists() and dst.is_dir() and any(dst.iterdir()):
            raise ArtifactError(f"{dst} exists and is not an ingot artifact; refusing to replace it")
        old = dst.with_name(f".{dst.name}.old")
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(old)
        os.replace(dst, old)
        os.replace(new, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, dst)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such artifact")
    mf = path / MANIFEST
    if not mf.is_file():
        raise ArtifactError(f"{path}: not an ingot artifact ({MANIFEST} is missing)")
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{mf}: not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{mf}: not an ingot manifest")
    v = manifest.get("format_version")
    if v != FORMAT_VERSION:
        raise ArtifactError(
            f"{mf}: format version {v} is not supported by this ingot (reads version {FORMAT_VERSION}); "
            "recompile the model"
        )
    return manifest


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Check that every file the manifest lists exists with its sha256, and nothing is missing."""
    files = manifest.get("files")
    if not isinstance(files, dict) or WEIGHTS not in files:
        raise ArtifactError(f"{path / MANIFEST}: the file list is missing or incomplete")
    verify_checksums(path, files)


def verify_checksums(path: Path, files: dict[str, str]) -> None:
    """Every entry of ``files`` (path relative to ``path`` -> sha256) exists inside ``path`` with that digest."""
    for rel, digest in files.items():
        p = path / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ArtifactError(f"{path / MANIFEST}: file entry {rel!r} points outside the artifact")
        if not p.is_file():
            raise ArtifactError(f"{p}: missing from the artifact")
        got = sha256_file(p)
        if got != digest:
            raise ArtifactError(
                f"{p}: checksum mismatch (sha256 {got[:16]}..., manifest says {digest[:16]}...): "
                "the file was modified or corrupted"
            )


def load_graph(path: str | os.PathLike, check: bool = True) -> tuple[Graph, dict[str, Any]]:
    """Load an artifact's graph with lazily memory-mapped weights."""
    path = Path(path)
    manifest = read_manifest(path)
    tp = manifest.get("tp")
    if isinstance(tp, dict) and int(tp.get("size", 1)) > 1 and "rank" not in tp:
        raise ArtifactError(
            f"{path}: a tensor-parallel artifact (tp={tp['size']}): its ranks run together through ingot.load, "
            f"ingot.LLM or ingot serve (runtime/tp); rank r alone is the artifact {path}/rank<r>")
    if check:
        verify_files(path, manifest)
    st = safetensors_io.SafetensorsFile(path / WEIGHTS)
    try:
        graph = parse_graph(manifest["graph"])
    except Exception as e:
        raise ArtifactError(f"{path / MANIFEST}: the graph does not parse: {e}") from None
    for name, value in graph.weight_values.items():
        if name not in st.entries:
            raise ArtifactError(f"{path / WEIGHTS}: weight {name!r} is missing")
        dtype, shape = st.info(name)
        if TensorType(dtype, shape) != TensorType(value.type.dtype, value.type.shape):
            raise ArtifactError(
                f"{path / WEIGHTS}: weight {name!r} is {dtype.value}{list(shape)}, the graph says {value.type}"
            )
        graph.weights[name] = Weight(value.type, lambda n=name: st.get(n), source=f"{path / WEIGHTS}:{name}")
    graph.meta = dict(manifest.get("meta", {}))
    verify(graph)
    return graph, manifest
