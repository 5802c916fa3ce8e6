"""The ``ingot`` command line: inspect, compile, run, generate."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def _load_any(path: Path):
    """A graph from a model file or an artifact directory, plus a label."""
    from .runtime.artifact import MANIFEST, load_graph

    if path.is_dir() and (path / MANIFEST).exists():
        graph, manifest = load_graph(path)
        return graph, f"artifact (target {manifest['target']}, mode {manifest['mode']})"
    from .api import import_model, resolve_model

    with console.status(f"importing {path} ..."):
        return import_model(resolve_model(path)), "model"


def _run_pipeline(graph, spec: str) -> None:
    """Run ``spec`` (a pipeline name or comma-separated pass names) over ``graph``; print what each pass
    did and the op counts before and after."""
    from .passes import PIPELINES, PassContext, TimingInstrument, run_passes

    pipeline = spec if spec in PIPELINES else [n.strip() for n in spec.split(",") if n.strip()]
    before = graph.op_histogram()
    timing = TimingInstrument()
    with console.status(f"running {spec} ..."):
        run_passes(graph, pipeline, PassContext(instruments=[timing]))
    t = Table(title=f"passes ({spec})", title_justify="left")
    for col in ("pass", "nodes", "changed", "ms"):
        t.add_column(col, justify="left" if col == "pass" else "right")
    for r in timing.records:
        t.add_row(r.name, f"{r.nodes_before} -> {r.nodes_after}", "yes" if r.changed else "no",
                  f"{r.seconds * 1e3:.1f}")
    out.print(t)
    after = graph.op_histogram()
    t = Table(title=f"ops before -> after ({sum(before.values())} -> {sum(after.values())} nodes)",
              title_justify="left")
    for col in ("op", "before", "after"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op in sorted(set(before) | set(after), key=lambda o: (-after.get(o, 0), -before.get(o, 0), o)):
        t.add_row(op, str(before.get(op, 0)), str(after.get(op, 0)))
    out.print(t)


def cmd_inspect(args: argparse.Namespace) -> int:
    graph, kind = _load_any(Path(args.model))
    if getattr(args, "passes", None):
        _run_pipeline(graph, args.passes)
        kind += f", after {args.passes}"
    out.print(f"[bold]{args.model}[/bold]: {kind}, graph @{graph.name}")
    for title, values, names in (
        ("inputs", graph.inputs, [v.name for v in graph.inputs]),
        ("outputs", graph.outputs, graph.output_names),
    ):
        t = Table(title=title, title_justify="left")
        t.add_column("name")
        t.add_column("type")
        for v, n in zip(values, names):
            t.add_row(escape(n), escape(str(v.type)))  # rich would read [a,b] as markup
        out.print(t)
    t = Table(title=f"ops ({len(graph.nodes)} nodes)", title_justify="left")
    t.add_column("op")
    t.add_column("count", justify="right")
    for op, n in graph.op_histogram().items():
        t.add_row(op, str(n))
    out.print(t)
    nbytes = sum((w.type.numel() or 0) * w.type.dtype.np.itemsize for w in graph.weights.values())
    out.print(f"parameters: {graph.num_parameters():,} in {len(graph.weights)} weights ({nbytes / 1e6:.2f} MB)")
    _print_quant_report(Path(args.model))
    cuda = _manifest_cuda(Path(args.model))
    _print_autotune(cuda)
    if getattr(args, "kernels", False):
        _print_kernels(cuda)
    if args.ir:
        out.print(str(graph), markup=False)
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from .api import compile
    from .quant.config import with_overrides

    t0 = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bar.add_task(step, total=total or None)
            bar.update(tasks[step], completed=done, total=total or None)

        from .passes import DumpIRInstrument, PassContext, TimingInstrument

        timing = TimingInstrument()
        instruments: list = [timing]
        if args.dump_ir:
            instruments.append(DumpIRInstrument(args.dump_ir))
        pipeline = None
        if args.passes:
            pipeline = args.passes if "," not in args.passes else [p for p in args.passes.split(",") if p]
        path = compile(args.model, target=args.target, out=args.output, quant=args.quant, mode=args.mode,
                       progress=progress, passes=pipeline, disable_passes=args.disable_pass or (),
                       pass_context=PassContext(target=args.target, instruments=instruments),
                       quant_config=with_overrides(args.quant_config, smooth=args.quant_smooth)
                       if args.quant or args.quant_config else None,
                       calib=args.calib, accuracy_budget=args.accuracy_budget,
                       quant_log=lambda line: console.print(line, markup=False), tp=args.tp,
                       quant_rounding=args.quant_rounding)
    if args.verbose:
        _print_pass_times(timing)
    _print_quant_report(Path(path))
    console.print(f"compiled {args.model} -> {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


def _print_quant_report(artifact: Path) -> None:
    """The per-layer quantization table of an artifact that has a ``quant_report.json``."""
    from .quant.report import REPORT, report_table

    if (artifact / REPORT).is_file():
        out.print(report_table(json.loads((artifact / REPORT).read_text())))


def _manifest_cuda(artifact: Path) -> dict | None:
    """An artifact's manifest ``cuda`` entry (codegen/lower.py); None for a CPU artifact or a model file."""
    path = artifact / "manifest.json"
    return json.loads(path.read_text()).get("cuda") if path.is_file() else None


def _print_autotune(cuda: dict | None) -> None:
    """The kernels a GPU artifact's compile autotuned (codegen/autotune.py): heuristic vs chosen time and config."""
    if cuda is None:
        return
    switches = cuda.get("switches")
    if switches is not None:  # the INGOT_* switches the compile saw (codegen/lower.py compile_switches)
        shown = ", ".join(f"{k}={v}" for k, v in switches.items()) or "none (every default)"
        out.print(f"compiled with: {escape(shown)}")
    summary = cuda.get("autotune")
    if not summary:
        return
    t = Table(title=f"autotuned kernels ({summary['kernels']}, {summary['changed']} changed; {summary['gpu']}, "
                    f"driver {summary['driver']})", title_justify="left")
    for col in ("kernel", "heuristic us", "chosen us", "speedup", "config (chosen / heuristic)"):
        t.add_column(col, justify="left" if col.startswith(("kernel", "config")) else "right")
    for table in ("kernels", "variant_kernels"):
        for entry, k in (cuda.get(table) or {}).items():
            rec = k.get("autotune")
            if not rec:
                continue
            h, c = rec.get("heuristic_us"), rec.get("chosen_us")
            diff = {n: v for n, v in rec["config"].items() if rec["heuristic_config"].get(n) != v}
            cfg = ", ".join(f"{n} {v} / {rec['heuristic_config'][n]}" for n, v in diff.items()) or "heuristic"
            t.add_row(escape(entry), "-" if h is None else f"{h:.2f}", "-" if c is None else f"{c:.2f}",
                      f"{h / c:.2f}x" if h and c else "-", escape(cfg))
    out.print(t)


def _print_kernels(cuda: dict | None) -> None:
    """``inspect --kernels``: a GPU artifact's kernels, each once: its family and template, the ops whose launches run
    it (as the launch's kernel, its variant or its alternative), the row counts it takes (a variant's ``max_rows``:
    the decode GEMVs' token buckets; ``any`` otherwise) and what its rule made of it (the spec's description: split-K,
    clusters, row groups, prologues, ...)."""
    if not cuda:
        out.print("kernels: none (not a GPU artifact)")
        return
    ops: dict[str, Counter[str]] = {}
    rows: dict[str, set[int]] = {}
    for launch in cuda.get("launches", []):
        op = str(launch.get("op", "?"))
        for k in [launch] + list(launch.get("variants", [])) + list(launch.get("alternatives", [])):
            ops.setdefault(k["kernel"], Counter())[op] += 1
            if "max_rows" in k:
                rows.setdefault(k["kernel"], set()).add(int(k["max_rows"]))
    table = {**cuda.get("kernels", {}), **cuda.get("variant_kernels", {}), **cuda.get("alternative_kernels", {})}
    t = Table(title=f"kernels ({len(table)}, {cuda.get('arch', '?')})", title_justify="left")
    for col in ("kernel", "family / template", "launches", "rows", "what"):
        t.add_column(col, overflow="fold")  # an entry name is never cut short
    for entry, k in sorted(table.items(), key=lambda kv: (kv[1].get("spec", {}).get("family", ""), kv[0])):
        spec = k.get("spec", {})
        used = ", ".join(f"{op} x{n}" for op, n in sorted(ops.get(entry, Counter()).items())) or "-"
        takes = ", ".join(f"<= {r}" for r in sorted(rows.get(entry, ()))) or "any"
        t.add_row(escape(entry), escape(f"{spec.get('family', '?')} / {spec.get('template', '?')}"), escape(used),
                  takes, escape(spec.get("doc", "")))
    # piped (not a terminal): wide enough for one line a kernel, for grep
    (out if out.is_terminal else Console(file=out.file, width=400, highlight=False)).print(t)


def _print_pass_times(timing) -> None:
    t = Table(title="passes", title_justify="left")
    for col in ("pass", "time (ms)", "nodes before", "nodes after", "rule hits"):
        t.add_column(col, justify="left" if col in ("pass", "rule hits") else "right")
    for r in timing.records:
        hits = ", ".join(f"{k}={v}" for k, v in sorted(r.stats.items()) if v)
        t.add_row(r.name, f"{r.seconds * 1e3:.1f}", str(r.nodes_before), str(r.nodes_after), escape(hits))
    total = sum(r.seconds for r in timing.records)
    t.add_row("total", f"{total * 1e3:.1f}", "", "", "")
    console.print(t)


def _load_array(file: str, spec: str) -> np.ndarray:
    try:
        arr = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0]
        if "pickle" in first:
            first = "not a .npy array file (object arrays are never unpickled)"
        raise ValueError(f"--input {spec}: cannot read {file} as a .npy array: {first}") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"--input {spec}: {file} is an .npz archive; pass it without NAME=")
    return arr


def _parse_inputs(specs: Sequence[str], dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        if "=" in spec:
            name, value = spec.split("=", 1)
            if value.lstrip().startswith("[") or value.strip().lstrip("-").replace(".", "", 1).isdigit():
                try:
                    literal = json.loads(value)
                except json.JSONDecodeError as e:
                    raise ValueError(f"--input {spec}: not a valid JSON array: {e}") from None
                if name not in dtypes:
                    raise ValueError(f"--input {spec}: the model has no input {name!r}; it has {sorted(dtypes)}")
                feeds[name] = np.asarray(literal).astype(dtypes[name])
            else:
                feeds[name] = _load_array(value, spec)
        elif spec.endswith(".npz"):
            try:
                with np.load(spec, allow_pickle=False) as z:
                    feeds.update({k: z[k] for k in z.files})
            except (OSError, ValueError) as e:
                raise ValueError(f"--input {spec}: cannot read it as .npz: {e}") from None
        else:
            raise SystemExit(f"--input {spec!r}: expected NAME=FILE.npy or FILE.npz")
    return feeds


def cmd_run(args: argparse.Namespace) -> int:
    from . import load

    model = load(args.artifact)
    feeds = _parse_inputs(args.input or [], {v.name: v.type.dtype.np for v in model.graph.inputs})
    t0 = time.perf_counter()
    outputs = model.run(feeds)
    dt = time.perf_counter() - t0
    for name, arr in outputs.items():
        flat = np.asarray(arr).reshape(-1)[:6]
        out.print(f"{name}: {arr.dtype}{list(arr.shape)} {np.array2string(flat, precision=5)}"
                  f"{' ...' if arr.size > 6 else ''}", markup=False)
        if args.output_dir:
            d = Path(args.output_dir)
            d.mkdir(parents=True, exist_ok=True)
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
            np.save(d / f"{safe}.npy", arr)
    console.print(f"ran in {dt * 1e3:.1f} ms")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .runtime.artifact import load_graph
    from .runtime.paged import PagedModel, iter_greedy
    from .runtime.tokenizer import StreamDecoder, Tokenizer

    graph, manifest = load_graph(args.artifact)
    if manifest.get("mode") != "llm":
        raise ValueError(f"{args.artifact}: a {manifest.get('mode')}-mode artifact; generate needs an LLM "
                         "compiled from a checkpoint (a .gguf file or a Hugging Face directory)")
    tok = Tokenizer(args.artifact)
    if args.chat:
        ids = tok.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        ids = tok.encode(args.prompt)
    block = int(manifest["kv_cache"]["block_size"])
    model = PagedModel(graph, num_blocks=-(-(len(ids) + args.max_tokens) // block))
    stream = StreamDecoder(tok)
    t0 = time.perf_counter()
    first = None
    for token in iter_greedy(graph, ids, args.max_tokens, model=model):
        first = first or time.perf_counter()
        sys.stdout.write(stream.push(token))
        sys.stdout.flush()
    sys.stdout.write("\n")
    n, dt = len(stream.ids), time.perf_counter() - t0
    decode = (time.perf_counter() - first) / max(n - 1, 1) if first else 0.0
    console.print(f"{len(ids)} prompt tokens, {n} new tokens in {dt:.1f} s "
                  f"(first token {((first or t0) - t0):.2f} s, {1 / decode if decode else 0:.1f} tokens/s after)")
    return 0


def cmd_passes_list(args: argparse.Namespace) -> int:
    """Every registered pass (plugins included) with its docstring's first line, then the pipelines."""
    from .passes import manager

    manager._ensure_builtin()
    width = max((len(n) for n in manager.PASSES), default=0)
    out.print("passes:")
    for name in sorted(manager.PASSES):
        cls = manager.PASSES[name]
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        out.print(f"  {name.ljust(width)}  {escape(doc[0].strip()) if doc else ''}")
    out.print("pipelines:")
    for name, passes in manager.PIPELINES.items():
        out.print(f"  {name}: {', '.join(passes) if passes else '(none)'}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .runtime.server import serve

    engine_args = {k: getattr(args, k) for k in ("num_blocks", "max_num_seqs", "max_num_batched_tokens",
                                                 "max_model_len", "block_size") if getattr(args, k) is not None}
    if args.device != "cpu":
        engine_args["device"] = args.device
    if args.role == "router":
        from .runtime.disagg.router import serve_router

        console.print(f"routing {args.artifact} on http://{args.host}:{args.port} (OpenAI API under /v1) to "
                      f"{len(args.worker or [])} worker(s) + those that register")
        serve_router(args.artifact, host=args.host, port=args.port, workers=args.worker or (), api_key=args.api_key,
                     model_name=args.served_model_name, max_model_len=args.max_model_len, log_level=args.log_level,
                     worker_timeout=args.worker_timeout)
        return 0
    if args.role in ("prefill", "decode"):
        from .runtime.disagg.worker import serve_worker

        console.print(f"{args.role} worker for {args.artifact} on http://{args.host}:{args.port}"
                      + (f", registering with {args.router}" if args.router else ""))
        serve_worker(args.artifact, args.role, host=args.host, port=args.port, router=args.router,
                     kv_port=args.kv_port, transfer_timeout=args.transfer_timeout, max_queue=args.max_queue,
                     log_level=args.log_level, kv_transport=args.kv_transport, **engine_args)
        return 0
    console.print(f"serving {args.artifact} on http://{args.host}:{args.port} (OpenAI API under /v1)")
    serve(args.artifact, host=args.host, port=args.port, api_key=args.api_key, max_queue=args.max_queue,
          model_name=args.served_model_name, log_level=args.log_level, **engine_args)
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import asyncio

    from .runtime.bench_serve import format_summary, run_benchmark, write_plot

    summary = asyncio.run(run_benchmark(
        args.url, num_prompts=args.num_prompts, concurrency=None if args.request_rate else args.concurrency,
        request_rate=args.request_rate, input_len=args.input_len, output_len=args.output_len,
        input_dist=args.input_dist, output_dist=args.output_dist, vocab=args.vocab, model=args.model,
        api_key=args.api_key, seed=args.seed))
    out.print(format_summary(summary), markup=False)
    path = Path(args.output)
    path.write_text(json.dumps(summary, indent=1))
    console.print(f"wrote {path}")
    if write_plot(summary, path.with_suffix(".png")):
        console.print(f"wrote {path.with_suffix('.png')}")
    return 0 if summary["failed"] == 0 else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .api import MODES, TARGETS

    p = argparse.ArgumentParser(prog="ingot", description="Ahead-of-time compiler and runtime for LLMs.")
    p.add_argument("--version", action="version", version=f"ingot {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("inspect", help="show a model's or artifact's inputs, outputs, ops and parameters")
    s.add_argument("model", help="an .onnx file or a .ingot artifact directory")
    s.add_argument("--ir", action="store_true", help="also print the graph in the text IR")
    s.add_argument("--kernels", action="store_true", help="a GPU artifact: also list its kernels, the launches that "
                   "run them and what each is (split-K, clusters, fusions, token buckets)")
    s.add_argument("--passes", metavar="PIPELINE", help="run a pipeline (O1, O2, llm, ...) or comma-separated "
                   "passes first; shows op counts before and after")
    s.set_defaults(fn=cmd_inspect)

    s = sub.add_parser("compile", help="compile a model into an artifact")
    s.add_argument("model", help="an .onnx file, a .gguf file, a Hugging Face checkpoint directory, "
                   "or a bundled model's name (smollm2)")
    s.add_argument("--target", default="cpu", choices=TARGETS, help="where the artifact will run (default cpu)")
    s.add_argument("-o", "--output", help="artifact directory (default: MODEL_NAME.ingot here)")
    s.add_argument("--mode", default="auto", choices=MODES, help="graph keeps the signature; llm serves")
    s.add_argument("--quant", default=None, choices=["fp8", "nvfp4", "mxfp4"],
                   help="quantize the linear layers (docs/QUANTIZATION.md)")
    s.add_argument("--quant-config", metavar="FILE", help="per-layer quantization config (JSON or YAML)")
    s.add_argument("--calib", metavar="FILE", help="calibration data: token ids (.npz/.npy) or prompts (.txt/.jsonl); "
                   "default: built-in stdlib-docstring text")
    s.add_argument("--quant-rounding", default=None, choices=["nearest", "gptq"],
                   help="how weights land on the grid: nearest (default) or gptq (error-compensating, uses the "
                        "calibration data; docs/QUANTIZATION.md)")
    s.add_argument("--quant-smooth", type=float, default=None, metavar="ALPHA",
                   help="migrate activation outliers into the weights before quantizing activations "
                        "(SmoothQuant, strength ALPHA in [0, 1], e.g. 0.5; docs/QUANTIZATION.md)")
    s.add_argument("--accuracy-budget", metavar="BUDGET", help="e.g. top1=0.95,kl=0.01: fall back layers until the "
                   "quantized model agrees this well with the unquantized one, or fail")
    s.add_argument("--passes", help="pipeline to run: a name (O0, O1, O2, llm) or a comma-separated list of passes "
                   "(default: O1; decoders in llm/auto mode: llm)")
    s.add_argument("--disable-pass", action="append", metavar="NAME", help="leave a pass out (repeatable)")
    s.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: shard the LLM over N ranks (GPUs), one artifact holding N shards "
                        "(docs/SCALE_OUT.md); N must divide the attention and KV heads")
    s.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass into DIR")
    s.add_argument("-v", "--verbose", action="store_true", help="print each pass's time, node counts and rule hits")
    s.set_defaults(fn=cmd_compile)

    s = sub.add_parser("run", help="run an artifact on inputs from .npy/.npz files")
    s.add_argument("artifact")
    s.add_argument("--input", "-i", action="append", metavar="NAME=FILE.npy|NAME=[JSON]|FILE.npz",
                   help="an input (repeatable): a .npy file, a JSON array literal, or an .npz of several")
    s.add_argument("--output-dir", help="save each output as NAME.npy here")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("generate", help="greedy-decode a prompt with an LLM artifact, streaming the text")
    s.add_argument("artifact", help="a .ingot artifact compiled from a checkpoint (mode llm)")
    s.add_argument("--prompt", "-p", required=True, help="the prompt text")
    s.add_argument("--max-tokens", type=int, default=64, help="most new tokens (default 64)")
    s.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("passes", help="the compiler's passes and pipelines")
    passes_sub = s.add_subparsers(dest="passes_command", required=True)
    s = passes_sub.add_parser("list", help="list registered passes (with plugins) and the pipelines")
    s.set_defaults(fn=cmd_passes_list)
    s = sub.add_parser("serve", help="serve an LLM artifact over an OpenAI-compatible HTTP API")
    s.add_argument("artifact", help="a .ingot artifact compiled in mode llm")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    s.add_argument("--served-model-name", default=None, help="the model id clients use (default: artifact name)")
    s.add_argument("--max-num-seqs", type=int, default=None, help="most sequences running at once (default 256)")
    s.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step (default 2048)")
    s.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    s.add_argument("--num-blocks", type=int, default=None, help="KV cache blocks (default: from a memory budget)")
    s.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu (default) or cuda: the first GPU; the artifact must be compiled for its target")
    s.add_argument("--max-queue", type=int, default=1024, help="requests that may wait; more get 503 (default 1024)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    g = s.add_argument_group("disaggregated serving (docs/SCALE_OUT.md)")
    g.add_argument("--role", default="single", choices=["single", "router", "prefill", "decode"],
                   help="single: one process serves everything (default); router: the OpenAI API in front of "
                   "prefill and decode workers; prefill/decode: a worker")
    g.add_argument("--router", metavar="URL", help="workers: register with this router (and re-register every second)")
    g.add_argument("--worker", action="append", metavar="URL", help="router: a worker known up front (repeatable)")
    g.add_argument("--kv-port", type=int, default=0, help="decode worker: KV receive port (default: any free one)")
    g.add_argument("--block-size", type=int, default=None, help="KV block size (default: the artifact's; CPU only)")
    g.add_argument("--transfer-timeout", type=float, default=30.0, help="workers: deadline of one KV transfer (s)")
    g.add_argument("--kv-transport", default="tcp", choices=["tcp", "nccl"],
                   help="workers: how KV moves from prefill to decode: tcp (through the hosts, default) or nccl "
                   "(GPU to GPU; both workers --device cuda, e.g. CUDA_VISIBLE_DEVICES=0 / 1)")
    g.add_argument("--worker-timeout", type=float, default=120.0,
                   help="router: deadline of a prefill call and of the gap between two streamed tokens (s)")
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("bench", help="benchmarks")
    bench_sub = s.add_subparsers(dest="bench_command", required=True)
    s = bench_sub.add_parser("serve", help="load-test an OpenAI-compatible server (streaming completions)")
    s.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    s.add_argument("--model", default=None, help="model id to send (default: none)")
    s.add_argument("--api-key", default=None)
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=8, help="clients in flight at once (default 8)")
    mode.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second instead")
    s.add_argument("--num-prompts", type=int, default=64)
    s.add_argument("--input-len", type=int, default=128, help="mean prompt length in tokens")
    s.add_argument("--output-len", type=int, default=64, help="mean output length in tokens")
    s.add_argument("--input-dist", default="uniform", choices=["fixed", "uniform", "exponential"])
    s.add_argument("--output-dist", default="uniform", choices=["fixed", "uniform", "exponential"])
    s.add_argument("--vocab", type=int, default=256, help="prompt token ids are drawn below this")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-o", "--output", default="bench_serve.json", help="JSON results (a .png plot beside it)")
    s.set_defaults(fn=cmd_bench_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .api import CompileError
    from .frontend.onnx import ImportError_
    from .ir.op import OpError
    from .runtime.artifact import ArtifactError
    from .runtime.cpu import FeedError

    try:
        return args.fn(args)
    except (CompileError, ImportError_, ArtifactError, FeedError, OpError, FileNotFoundError, ValueError) as e:
        console.print("[red]error:[/red] " + escape(str(e)))
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
