"""Read a cubin's SASS with ``cuobjdump`` (toolkit, or the pip wheel ``nvidia-cuda-cuobjdump``).

A build can succeed and still be wrong (an arch-conditional kernel built for the plain arch has a
trap for a body), so tests check the SASS for the architecture and the instructions they expect.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def find_cuobjdump() -> str | None:
    """The pip wheel's ``nvidia/cu13/bin/cuobjdump`` (or cu12), else the toolkit's, else None."""
    for base in map(Path, sys.path):
        for cu in ("cu13", "cu12"):
            p = base / "nvidia" / cu / "bin" / "cuobjdump"
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return shutil.which("cuobjdump") or (
        str(Path(home) / "bin" / "cuobjdump") if (Path(home) / "bin" / "cuobjdump").is_file() else None)


def disassemble(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin; raises ``RuntimeError`` when cuobjdump is missing or fails."""
    tool = find_cuobjdump()
    if tool is None:
        raise RuntimeError(
            "cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or a CUDA toolkit)")
    with tempfile.TemporaryDirectory(prefix="ingot-sass-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        # cuobjdump runs nvdisasm for SASS; the pip wheels put both in the same bin directory
        env = dict(os.environ)
        env["PATH"] = str(Path(tool).parent) + os.pathsep + env.get("PATH", "")
        env.setdefault("NVDISASM_PATH", str(Path(tool).parent))
        r = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def sass_arch(sass: str) -> str | None:
    """The architecture a SASS listing says it is code for (``sm_90a``)."""
    m = re.search(r"code for (sm_\w+)", sass)
    return m.group(1) if m else None


def opcodes(sass: str) -> set[str]:
    """Every opcode (with modifiers, ``HMMA.16816.F32.BF16``) in a listing."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    return set(ops)
