"""Disaggregated prefill/decode serving: a router, prefill workers and decode workers, and the KV
transfer between them (docs/SCALE_OUT.md).

- ``layout``: the KV layout descriptor and the conversions on receive (block size, dtype, TP heads)
- ``transport``: the transport interface, the process (TCP, length-prefixed frames) transport, staging
- ``nccl``: the NCCL send/recv transport (GPU machines only; not run in CI)
- ``worker``: prefill and decode workers (``ingot serve --role prefill|decode``)
- ``router``: the OpenAI-API router (``ingot serve --role router``)
"""

from .layout import KVLayout, KVTransfer, LayoutError, assemble_tokens, blocks_to_tokens, tokens_to_blocks
from .transport import KVSender, TcpKVReceiver, TcpKVSender, TransferError, TransferStore

__all__ = ["KVLayout", "KVTransfer", "LayoutError", "assemble_tokens", "blocks_to_tokens", "tokens_to_blocks",
           "KVSender", "TcpKVReceiver", "TcpKVSender", "TransferError", "TransferStore"]
