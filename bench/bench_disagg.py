"""Disaggregated prefill/decode on two GPUs: the KV transfer's GB/s over NCCL beside the link's limit, and
TTFT / ITL percentiles under a mixed load, disaggregated (prefill GPU 0, decode GPU 1) vs one GPU serving
everything. Llama-3.2-1B-shaped model with random weights (bench/make_llama1b.py; nothing is downloaded).

    python bench/bench_disagg.py                  # transfer + mixed load, 16 layers (~3-4 min with the build)
    python bench/bench_disagg.py --quick          # 2 layers, shorter load (~1.5 min)
    python bench/bench_disagg.py --transfer-only  # the NCCL GB/s alone (~20 s)
    python bench/bench_disagg.py --workdir /tmp/bd --reuse   # keep / reuse the checkpoint and artifact
    python bench/bench_disagg.py --compile-only --target h200  # no GPU needed: the artifact only

(a) Transfer: two processes (GPU 0 sends, GPU 1 receives; one GPU visible to each, as the workers run)
join a two-rank NCCL communicator (runtime/tp/nccl.py) and move the KV bytes of prompts of 128 .. 8192
tokens of the 1B shape (16 layers x 2 x 8 KV heads x 64 x bf16 = 32 KiB per token; a 2k prompt is
64 MiB). Per size: warm-up, then ``--iters`` back-to-back ncclSend / ncclRecv timed with CUDA events on
each side after a 1-byte barrier; GB/s = bytes / (receiver's time / iters). The bytes are checked at
the receiver once. Also timed on GPU 0: the gather of a 2k-token request's blocks out of a paged cache
into the send buffer (contiguous and scattered block ids), the copy the prefill worker does per request.
The link's limit is queried (``nvidia-smi nvlink -s``, ``nvidia-smi topo -m``) and printed beside an
assumed 450 GB/s per direction (H100/H200 NVLink 4: 18 links x 25 GB/s; 900 GB/s both directions).

(b) Mixed load, one run: the same requests (seeded token ids) with the same arrival times go first to
one GPU (``ingot serve --device cuda`` on GPU 0), then to router + prefill worker (GPU 0) + decode worker
(GPU 1) with ``--kv-transport nccl``. ``--streams`` requests with ``--stream-prompt``-token prompts decode
``--stream-tokens`` tokens each, started together; ``--long-prompts`` requests of ``--long-len`` tokens
(``--long-tokens`` output) arrive every ``--interval-ms`` from ``--start-ms`` on. TTFT (request sent ->
first token), ITL (gap between two streamed chunks) and TPOT (a stream's decode time per token)
percentiles per class, measured by the client (httpx streaming). The disaggregated run's transfers
(count, bytes, mean time per request including the TCP descriptor and ack) come from the workers'
/internal/info.

Prints JSON lines (``"bench": "transfer" | "gather" | "link" | "mixed"``, then ``"summary"``); exit code 0
when everything ran, 1 when something failed (the error is printed as JSON, then the traceback and the
servers' logs), 2 when the machine cannot run it (fewer than 2 GPUs, no libnccl).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: bytes of KV per token of the Llama-3.2-1B shape: layers x (K, V) x KV heads x head_dim x bf16
LLAMA1B_KV_BYTES_PER_TOKEN = 16 * 2 * 8 * 64 * 2
ASSUMED_LIMIT_GBPS = 450.0  # NVLink 4 (H100/H200), one direction: 18 links x 25 GB/s


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def gpu_ids() -> tuple[str, str]:
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (visible[0], visible[1]) if len(visible) >= 2 else ("0", "1")


def pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "n": 0}
    a = np.asarray(values) * 1e3
    return {"p50": round(float(np.percentile(a, 50)), 3), "p90": round(float(np.percentile(a, 90)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "n": len(values)}


# -- (a) the link and the raw transfer ---------------------------------------------------------------


def link_info() -> dict[str, Any]:
    """What nvidia-smi says about the NVLinks of GPU 0 and the GPU0-GPU1 connection (each call under 20 s)."""
    info: dict[str, Any] = {"assumed_limit_GBps_per_direction": ASSUMED_LIMIT_GBPS,
                            "assumed_from": "H100/H200 NVLink 4 spec: 18 links x 25 GB/s per direction"}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        info["nvidia_smi"] = "not found"
        return info
    g0, g1 = gpu_ids()
    try:
        out = subprocess.run([smi, "nvlink", "-s", "-i", g0], capture_output=True, text=True, timeout=20).stdout
        speeds = [float(x) for x in re.findall(r"Link \d+:\s*([\d.]+)\s*GB/s", out)]
        info["nvlink_links_gpu0"] = len(speeds)
        info["nvlink_GBps_per_link"] = sorted(set(speeds))
        info["nvlink_sum_GBps_gpu0"] = round(sum(speeds), 1)
        if not speeds:
            info["nvlink_status_raw"] = out.strip()[:400]
    except (OSError, subprocess.SubprocessError) as e:
        info["nvlink_error"] = f"{type(e).__name__}: {e}"
    try:
        out = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
        for line in out.splitlines():
            cols = line.split()
            if cols and cols[0] == f"GPU{g0}":
                info["topo_gpu0_row"] = " ".join(cols[: 12])
                idx = 1 + int(g1) if g1.isdigit() else None
                if idx is not None and idx < len(cols):
                    info["topo_gpu0_to_gpu1"] = cols[idx]
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        info["topo_error"] = f"{type(e).__name__}: {e}"
    return info


def _transfer_rank(rank: int, uid: bytes, sizes: list[int], iters: int, conn: Any) -> None:
    """One side of the raw transfer (a spawned process seeing one GPU). Sends results (or an error) on ``conn``."""
    try:
        from ingot.runtime import cuda_driver as cd
        from ingot.runtime.cuda_launch import address_of as _address
        from ingot.runtime.tp import nccl

        ctx = cd.Context(0)
        stream = cd.Stream()
        s = _address(stream.handle)
        comm = nccl.NcclAllReduce(rank, 2, uid, device=0)
        peer = 1 - rank
        big = max(sizes)
        buf = cd.DeviceMemory(big)
        flag = cd.DeviceMemory(1)
        check = np.random.default_rng(7).integers(0, 256, min(big, 64 << 20), dtype=np.uint8)
        if rank == 0:
            cd.memcpy_htod(buf.ptr, check.ctypes.data, check.nbytes)
        else:
            cd.memset(buf.ptr, check.nbytes, 0)

        def op(n: int) -> None:
            if rank == 0:
                nccl.send_bytes(comm, buf.ptr, n, peer, s)
            else:
                nccl.recv_bytes(comm, buf.ptr, n, peer, s)

        def barrier() -> None:
            if rank == 0:
                nccl.send_bytes(comm, flag.ptr, 1, peer, s)
            else:
                nccl.recv_bytes(comm, flag.ptr, 1, peer, s)

        def sync(deadline: float) -> None:
            while not cd.stream_done(stream):
                err = nccl.async_error(comm)
                if err not in (0, nccl.NCCL_IN_PROGRESS):
                    raise nccl.NcclError(f"NCCL async error {err} ({nccl.error_string(err)})")
                if time.monotonic() > deadline:
                    comm.abort()
                    raise TimeoutError("NCCL transfer did not complete within 60 s (communicator aborted)")
                time.sleep(1e-4)

        # correctness once: the first 64 MiB arrive intact
        op(check.nbytes)
        sync(time.monotonic() + 60)
        if rank == 1:
            got = np.empty_like(check)
            cd.memcpy_dtoh(got.ctypes.data, buf.ptr, got.nbytes)
            if not np.array_equal(got, check):
                raise RuntimeError(f"received bytes differ from the sent ones ({int((got != check).sum())} bytes)")
        results = []
        start, end = cd.Event(), cd.Event()
        for n in sizes:
            for _ in range(2):
                op(n)
            barrier()
            start.record(stream)
            for _ in range(iters):
                op(n)
            end.record(stream)
            sync(time.monotonic() + 60)
            results.append({"bytes": n, "ms": end.elapsed_ms(start) / iters})
        gather = _gather_timing(cd, stream) if rank == 0 else None
        conn.send({"ok": True, "rank": rank, "results": results, "gather": gather, "device": ctx.name})
        comm.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send({"ok": False, "rank": rank, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()})


def _gather_timing(cd: Any, stream: Any) -> list[dict[str, Any]]:
    """GPU 0: a 2k-token request's blocks (1B shape, block size 16) out of a paged cache into a send buffer."""
    from ingot.runtime.cuda_backend import block_runs, kv_block_copies

    layers, block_bytes, num_blocks, nb = 16, 16 * 8 * 64 * 2 * 2, 4096, 2048 // 16
    cache = cd.DeviceMemory(layers * num_blocks * block_bytes)
    out = cd.DeviceMemory(layers * nb * block_bytes)
    rng = np.random.default_rng(0)
    cases = {"contiguous": list(range(100, 100 + nb)),
             "scattered": [int(b) for b in rng.choice(num_blocks, nb, replace=False)]}
    res = []
    start, end = cd.Event(), cd.Event()
    for name, ids in cases.items():
        addrs = [cache.ptr + layer * num_blocks * block_bytes for layer in range(layers)]
        copies = kv_block_copies(addrs, block_bytes, ids, out.ptr, to_buffer=True)
        for _ in range(2):
            for d, s, n in copies:
                cd.memcpy_dtod(d, s, n, stream)
        stream.synchronize()
        t0 = time.perf_counter()
        start.record(stream)
        for d, s, n in copies:
            cd.memcpy_dtod(d, s, n, stream)
        end.record(stream)
        end.synchronize()
        host_ms = (time.perf_counter() - t0) * 1e3
        res.append({"ids": name, "copies": len(copies), "runs": len(block_runs(ids)),
                    "bytes": layers * nb * block_bytes, "device_ms": round(end.elapsed_ms(start), 4),
                    "host_ms": round(host_ms, 4)})
    return res


def run_transfer(a: argparse.Namespace) -> dict[str, Any]:
    from ingot.runtime.tp.nccl import new_unique_id

    sizes = [t * LLAMA1B_KV_BYTES_PER_TOKEN for t in a.transfer_tokens]
    uid = new_unique_id()
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        for rank, gpu in enumerate(gpu_ids()):
            parent, child = ctx.Pipe(duplex=False)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # read by the spawned child at start
            p = ctx.Process(target=_transfer_rank, args=(rank, uid, sizes, a.iters, child), daemon=True)
            p.start()
            procs.append(p)
            conns.append(parent)
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    got: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + a.transfer_timeout
    try:
        for rank, c in enumerate(conns):
            left = deadline - time.monotonic()
            if left <= 0 or not c.poll(left):
                raise TimeoutError(f"transfer rank {rank} gave no result within {a.transfer_timeout} s "
                                   f"(alive: {[p.is_alive() for p in procs]}; NCCL_DEBUG=INFO says more)")
            got[rank] = c.recv()
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    for r in (0, 1):
        if not got[r]["ok"]:
            sys.stderr.write(got[r].get("traceback", ""))
            raise RuntimeError(f"transfer rank {r} failed: {got[r]['error']}")
    best = 0.0
    for send, recv in zip(got[0]["results"], got[1]["results"]):
        n = recv["bytes"]
        gbps = n / (recv["ms"] * 1e-3) / 1e9
        best = max(best, gbps)
        emit(bench="transfer", tokens_1b=n // LLAMA1B_KV_BYTES_PER_TOKEN, bytes=n, iters=a.iters,
             recv_ms=round(recv["ms"], 4), send_ms=round(send["ms"], 4), GBps=round(gbps, 1),
             fraction_of_assumed_limit=round(gbps / ASSUMED_LIMIT_GBPS, 3),
             devices=[got[0]["device"], got[1]["device"]])
    for g in got[0]["gather"] or []:
        emit(bench="gather", what="2k-token request, 1B shape, 128 blocks of 16 tokens -> send buffer", **g,
             device_GBps=round(g["bytes"] / (g["device_ms"] * 1e-3) / 1e9, 1) if g["device_ms"] else None)
    return {"best_GBps": round(best, 1)}


# -- (b) mixed load ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``ingot serve`` process, its output in a log file."""

    def __init__(self, name: str, artifact: Path, args: list[str], logdir: Path, env: dict[str, str]) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logdir / f"{name}.log"
        self._f = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingot.cli", "serve", str(artifact), "--port", str(self.port), "--log-level",
             "warning", *args], stdout=self._f, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"), **env})

    def wait_healthy(self, deadline: float) -> None:
        import httpx

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not come up in time:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._f.close()


def make_requests(a: argparse.Namespace, vocab: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(a.seed)
    reqs = []
    for i in range(a.streams):
        reqs.append({"kind": "stream", "at": 0.002 * i, "max_tokens": a.stream_tokens,
                     "prompt": rng.integers(0, vocab, a.stream_prompt).tolist()})
    for k in range(a.long_prompts):
        reqs.append({"kind": "long", "at": (a.start_ms + k * a.interval_ms) / 1e3, "max_tokens": a.long_tokens,
                     "prompt": rng.integers(0, vocab, a.long_len).tolist()})
    return reqs


async def _one(client: Any, url: str, req: dict[str, Any], t_base: float, timeout: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, t_base + req["at"] - time.perf_counter()))
    body = {"prompt": req["prompt"], "max_tokens": req["max_tokens"], "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    res: dict[str, Any] = {"kind": req["kind"], "sent": time.perf_counter() - t_base, "ttft": None, "itl": [],
                           "tokens": [], "error": None}
    t0 = last = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                res["error"] = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    res["error"] = str(event["error"])[:300]
                    return res
                ch = event["choices"][0]
                toks = ch.get("token_ids") or ([] if not ch.get("text") else [-1])
                if not toks:
                    continue
                now = time.perf_counter()
                if res["ttft"] is None:
                    res["ttft"] = now - t0
                else:
                    res["itl"].append(now - last)
                last = now
                res["tokens"] += toks
    except Exception as e:  # noqa: BLE001 - counted as a failed request
        res["error"] = f"{type(e).__name__}: {e}"
    res["done"] = time.perf_counter() - t_base
    return res


async def drive(url: str, reqs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=128)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t_base = time.perf_counter() + 0.05
        return list(await asyncio.gather(*(_one(client, url, r, t_base, timeout) for r in reqs)))


def warm_up(url: str, vocab: int, a: argparse.Namespace) -> None:
    """Every decode batch bucket up to 32 (CUDA graphs captured on first use) and one long prefill."""
    rng = np.random.default_rng(1)
    reqs = [{"kind": "w", "at": 0.0, "max_tokens": 2 + i, "prompt": rng.integers(0, vocab, 48).tolist()}
            for i in range(32)]
    reqs.append({"kind": "w", "at": 0.0, "max_tokens": 4, "prompt": rng.integers(0, vocab, a.long_len).tolist()})
    out = asyncio.run(drive(url, reqs, a.request_timeout))
    bad = [r["error"] for r in out if r["error"]]
    if bad:
        raise RuntimeError(f"warm-up requests to {url} failed: {bad[:3]}")


def summarize(mode: str, out: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    errors = [r["error"] for r in out if r["error"]]
    streams = [r for r in out if r["kind"] == "stream" and not r["error"]]
    longs = [r for r in out if r["kind"] == "long" and not r["error"]]
    stream_end = max((r.get("done", 0.0) for r in streams), default=0.0)
    overlap = sum(1 for r in longs if r["sent"] < stream_end)
    s = {"bench": "mixed", "mode": mode, "wall_s": round(wall, 2), "requests": len(out), "errors": len(errors),
         "ttft_long_ms": pct([r["ttft"] for r in longs if r["ttft"] is not None]),
         "ttft_stream_ms": pct([r["ttft"] for r in streams if r["ttft"] is not None]),
         "itl_stream_ms": pct([x for r in streams for x in r["itl"]]),
         "itl_long_ms": pct([x for r in longs for x in r["itl"]]),
         # per stream: (last token - first token) / (tokens - 1); chunk gaps can bunch up in the client's reads
         "tpot_stream_ms": pct([sum(r["itl"]) / (len(r["tokens"]) - 1) for r in streams if len(r["tokens"]) > 1]),
         "long_prompts_arriving_while_streams_decode": overlap,
         "tokens": sum(len(r["tokens"]) for r in out)}
    if errors:
        s["first_errors"] = errors[:3]
    return s


def build(a: argparse.Namespace, target: str) -> tuple[Path, int]:
    import ingot
    from ingot.passes import PassContext

    made = a.ckpt or a.workdir / "llama1b-ckpt"
    art = a.workdir / (f"{a.ckpt.name}-{target}.ingot" if a.ckpt else f"llama1b-{a.layers}l-{target}.ingot")
    if a.reuse and (art / "manifest.json").is_file():
        emit(event="compile", reused=True, path=str(art))
    else:
        if not a.ckpt and not (a.reuse and (made / "config.json").is_file()
                and json.loads((made / "config.json").read_text())["num_hidden_layers"] == a.layers):
            from bench.make_llama1b import make_checkpoint

            t0 = time.perf_counter()
            make_checkpoint(made, a.layers)
            emit(event="checkpoint", layers=a.layers, seconds=round(time.perf_counter() - t0, 1))
        limits = {"max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": a.max_num_batched_tokens,
                  "max_model_len": a.max_model_len}
        t0 = time.perf_counter()
        ingot.compile(made, target=target, out=art, pass_context=PassContext(target=target,
                                                                             options={"cuda": limits}))
        emit(event="compile", target=target, layers=a.layers, seconds=round(time.perf_counter() - t0, 1), **limits)
    vocab = int(json.loads((art / "manifest.json").read_text())["llm"]["vocab_size"])
    return art, vocab


def run_mixed(a: argparse.Namespace, art: Path, vocab: int) -> dict[str, Any]:
    import httpx

    g0, g1 = gpu_ids()
    logdir = a.workdir / "logs"
    logdir.mkdir(exist_ok=True)
    engine = ["--device", a.device, "--num-blocks", str(a.num_blocks), "--max-num-seqs", str(a.max_num_seqs),
              "--max-model-len", str(a.max_model_len), "--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    servers: list[Server] = []
    try:
        t0 = time.monotonic()
        single = Server("single", art, engine, logdir, {"CUDA_VISIBLE_DEVICES": g0})
        router = Server("router", art, ["--role", "router", "--max-model-len", str(a.max_model_len),
                                        "--worker-timeout", str(a.request_timeout)], logdir, {})
        servers += [single, router]
        router.wait_healthy(time.monotonic() + 120)
        transport = "nccl" if a.device == "cuda" else "tcp"  # cpu: a check of this script on a CPU machine
        worker = ["--router", router.url, "--kv-transport", transport, "--transfer-timeout", "60", *engine]
        prefill = Server("prefill", art, ["--role", "prefill", *worker], logdir, {"CUDA_VISIBLE_DEVICES": g0})
        decode = Server("decode", art, ["--role", "decode", *worker], logdir, {"CUDA_VISIBLE_DEVICES": g1})
        servers += [prefill, decode]
        for s in (single, prefill, decode):
            s.wait_healthy(time.monotonic() + a.start_timeout)
        deadline = time.monotonic() + 60
        while True:
            ws = httpx.get(router.url + "/internal/workers", timeout=10).json()["workers"]
            if sum(w["healthy"] for w in ws) >= 2:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not register with the router: {ws}")
            time.sleep(0.2)
        emit(event="servers_up", seconds=round(time.monotonic() - t0, 1), gpus={"single": g0, "prefill": g0,
                                                                             "decode": g1})
        reqs = make_requests(a, vocab)
        results = {}
        outs = {}
        for mode, url in (("one_gpu", single.url), ("disaggregated", router.url)):
            t1 = time.perf_counter()
            warm_up(url, vocab, a)
            emit(event="warm_up", mode=mode, seconds=round(time.perf_counter() - t1, 1))
            before = httpx.get(prefill.url + "/internal/info", timeout=10).json()["transfer"]
            t1 = time.perf_counter()
            outs[mode] = asyncio.run(drive(url, reqs, a.request_timeout))
            results[mode] = summarize(mode, outs[mode], time.perf_counter() - t1)
            if mode == "disaggregated":  # the measured run's transfers (the warm-up's set up the channel)
                tr = httpx.get(prefill.url + "/internal/info", timeout=10).json()["transfer"]
                idec = httpx.get(decode.url + "/internal/info", timeout=10).json()
                n, b = tr["transfers_sent"] - before["transfers_sent"], tr["bytes_sent"] - before["bytes_sent"]
                sec = tr["seconds_sending"] - before["seconds_sending"]
                results[mode]["kv_transfer"] = {
                    "transfers": n, "bytes": b, "seconds": round(sec, 4),
                    "mean_ms": round(sec / n * 1e3, 3) if n else None,
                    "GBps_per_request_path": round(b / sec / 1e9, 2) if sec else None,
                    "what": "prefill worker: descriptor over TCP + ncclSend + ack, per request (latency included)",
                    "nccl_channels": tr["channels"], "decode_prefilled": idec["prefilled"]}
            emit(**results[mode])
        same = sum(x["tokens"] == y["tokens"] for x, y in zip(outs["one_gpu"], outs["disaggregated"])
                   if not x["error"] and not y["error"])
        return {"results": results, "greedy_equal_requests": same, "requests": len(reqs)}
    except BaseException:
        for s in servers:
            s.stop()
            sys.stderr.write(f"--- {s.name} log ({s.log}) ---\n{s.tail()}\n")
        raise
    finally:
        for s in servers:
            s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 layers, 8 streams x 64 tokens, 4 long prompts")
    ap.add_argument("--transfer-only", action="store_true", help="only (a): the NCCL GB/s")
    ap.add_argument("--mixed-only", action="store_true", help="only (b): the mixed load")
    ap.add_argument("--compile-only", action="store_true", help="build the artifact and stop (no GPU needed)")
    ap.add_argument("--target", default=None, help="h200 / h100 / b200 (default: GPU 0's)")
    ap.add_argument("--workdir", type=Path, default=None, help="checkpoint, artifact, logs (default: a temp dir)")
    ap.add_argument("--reuse", action="store_true", help="reuse the checkpoint and artifact in --workdir")
    ap.add_argument("--layers", type=int, default=None, help="model depth (default 16; --quick 2)")
    ap.add_argument("--ckpt", type=Path, default=None, help="an HF checkpoint dir instead of the made 1B shape")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: run (b) on the CPU backend with the TCP transport, to check this script without GPUs")
    ap.add_argument("--transfer-tokens", default="128,512,2048,8192", help="prompt lengths whose KV is moved")
    ap.add_argument("--iters", type=int, default=20, help="timed transfers per size (default 20)")
    ap.add_argument("--transfer-timeout", type=float, default=180.0, help="deadline of the transfer part (s)")
    ap.add_argument("--streams", type=int, default=None, help="decoding streams (default 16; --quick 8)")
    ap.add_argument("--stream-prompt", type=int, default=128, help="stream prompt tokens (default 128)")
    ap.add_argument("--stream-tokens", type=int, default=None, help="tokens each stream decodes (default 384)")
    ap.add_argument("--long-prompts", type=int, default=None, help="long prompts arriving (default 12; --quick 4)")
    ap.add_argument("--long-len", type=int, default=2048, help="long prompt tokens (default 2048)")
    ap.add_argument("--long-tokens", type=int, default=16, help="tokens each long prompt generates (default 16)")
    ap.add_argument("--interval-ms", type=float, default=250.0, help="between long prompt arrivals (default 250)")
    ap.add_argument("--start-ms", type=float, default=300.0, help="first long prompt after the streams start")
    ap.add_argument("--max-num-seqs", type=int, default=48)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=None, help="default: fits the requests, x256")
    ap.add_argument("--num-blocks", type=int, default=None, help="KV blocks per engine (default: fits max_num_seqs)")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--start-timeout", type=float, default=300.0, help="deadline for the servers to load (s)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.layers = a.layers or (2 if a.quick else 16)
    a.streams = a.streams if a.streams is not None else (8 if a.quick else 16)
    a.stream_tokens = a.stream_tokens or (64 if a.quick else 384)
    a.long_prompts = a.long_prompts if a.long_prompts is not None else (4 if a.quick else 12)
    a.transfer_tokens = [int(t) for t in a.transfer_tokens.split(",") if t.strip()]
    need = max(a.long_len + a.long_tokens, a.stream_prompt + a.stream_tokens) + 16
    a.max_model_len = a.max_model_len or -(-need // 256) * 256
    a.num_blocks = a.num_blocks or a.max_num_seqs * (a.max_model_len // 16) + 64
    if a.streams + a.long_prompts > a.max_num_seqs:
        emit(note=f"{a.streams + a.long_prompts} requests may run at once, max_num_seqs is {a.max_num_seqs}: "
             "some wait in the queue")

    if a.device == "cpu":
        a.mixed_only, a.target = True, "cpu"
    if not a.compile_only and a.device == "cuda":
        try:
            from ingot.runtime.disagg.nccl import available
            from ingot.runtime.tp.nccl import version

            ok, why = available()
            if not ok:
                emit(error=f"cannot run: {why}")
                return 2
            emit(event="env", nccl_version=version(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                 gpus=list(gpu_ids()))
        except Exception as e:  # noqa: BLE001 - reported as JSON
            emit(error=f"cannot run: {type(e).__name__}: {e}")
            return 2
    tmp = None
    if a.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ingot-bench-disagg-")
        a.workdir = Path(tmp.name)
    a.workdir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"summary": "disagg"}
    try:
        if not a.compile_only and not a.mixed_only:
            emit(bench="link", **link_info())
            summary["transfer"] = run_transfer(a)
            summary["transfer"]["assumed_limit_GBps"] = ASSUMED_LIMIT_GBPS
        if not a.transfer_only:
            if a.target:
                target = a.target
            elif a.compile_only:
                target = "h200"
            else:
                from ingot.runtime.cuda_driver import Context

                sm = Context(0).sm
                target = {90: "h200", 100: "b200"}.get(sm) or ""
                if not target:
                    emit(error=f"cannot run: GPU 0 is sm_{sm}; ingot builds for sm_90a (h200) and sm_100a (b200)")
                    return 2
            art, vocab = build(a, target)
            if a.compile_only:
                return 0
            mixed = run_mixed(a, art, vocab)
            r1, r2 = mixed["results"]["one_gpu"], mixed["results"]["disaggregated"]

            def ratio(key: str, p: str) -> float | None:
                x, y = r1[key][p], r2[key][p]
                return round(y / x, 3) if x and y else None

            summary["mixed"] = {
                "layers": json.loads((art / "manifest.json").read_text())["kv_cache"]["num_layers"],
                "streams": a.streams, "long_prompts": a.long_prompts, "long_len": a.long_len,
                "disagg_over_one_gpu": {f"{k}_{p}": ratio(k, p)
                                        for k in ("ttft_long_ms", "itl_stream_ms", "tpot_stream_ms")
                                        for p in ("p50", "p90", "p99")},
                "greedy_equal_requests": f"{mixed['greedy_equal_requests']} of {mixed['requests']}",
                "errors": r1["errors"] + r2["errors"]}
            if r1["errors"] or r2["errors"]:
                emit(**summary)
                return 1
        emit(**summary)
        return 0
    except Exception as e:  # noqa: BLE001 - one JSON line saying what failed, then the traceback
        emit(error=f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
