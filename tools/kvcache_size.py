"""KV-cache size calculator (`mooncake kvcache-size`).

Per layer and token, a model stores:

* MHA / GQA / MQA: K and V for each KV head: 2 * num_key_value_heads * head_dim elements
  (head_dim = config.head_dim, else hidden_size / num_attention_heads);
* MLA (DeepSeek-V2/V3, Kimi-K2): one compressed latent plus the decoupled RoPE key: kv_lora_rank + qk_rope_head_dim.

Bytes = elements * bytes per element of the dtype (fp32 4, bf16/fp16 2, fp8 1). Sliding-window layers keep at most
`window` tokens, so a request of N tokens costs sum over layers of elements * min(N, window_layer) * dtype bytes;
`bytes_per_token` is the cost of one token held in every layer (exact for requests within the shortest window).

Sliding-window layers are found, in order, from `layer_types` ("sliding_attention"), Qwen2's
`use_sliding_window`/`max_window_layers` (layers >= max_window_layers slide), Gemma-3's `sliding_window_pattern`
(every pattern-th layer is global), Gemma-2 (even layers slide), else `sliding_window` applies to every layer.

Tensor parallelism (`tp`): KV heads are split over the ranks (tp must divide the KV heads, or be a multiple of them,
in which case each rank keeps one head); an MLA latent is replicated on every rank.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Optional

from .common import ToolError, format_table, human_bytes, parse_count
from .presets import PRESETS, get_preset, preset_names

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1,
               "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
DEFAULT_BLOCK_SIZE = 512
GIB = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    """The KV-relevant shape of a model. `num_kv_heads`/`head_dim` are None for MLA, `mla_dim` None otherwise;
    `layer_windows[i]` is layer i's sliding window in tokens (None = full attention)."""

    name: str
    attention: str
    num_layers: int
    num_kv_heads: Optional[int]
    head_dim: Optional[int]
    mla_dim: Optional[int]
    layer_windows: tuple

    def kv_heads_per_rank(self, tp: int) -> Optional[int]:
        """KV heads each tensor-parallel rank stores (None for MLA). Raises ToolError when tp does not fit."""
        if tp < 1:
            raise ToolError(f"--tp must be >= 1, got {tp}")
        if self.num_kv_heads is None:
            return None
        kv = self.num_kv_heads
        if tp <= kv and kv % tp == 0:
            return kv // tp
        if tp > kv and tp % kv == 0:
            return 1
        raise ToolError(f"--tp {tp} does not divide the {kv} KV heads of {self.name} (nor is a multiple of them)")

    def elements_per_layer_token(self, tp: int = 1) -> int:
        """Stored elements per token and layer on one rank of a tp-way group."""
        if self.mla_dim is not None:
            return self.mla_dim
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim

    def describe(self) -> str:
        if self.mla_dim is not None:
            core = f"MLA: {self.num_layers} layers x {self.mla_dim} latent+rope dims"
        else:
            core = (f"{self.attention}: {self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} dims "
                    "(K and V)")
        sliding = [w for w in self.layer_windows if w is not None]
        if sliding:
            core += f"; {len(sliding)} sliding-window layers (window {max(sliding)})"
        return core


def _positive_int(cfg: dict, key: str, where: str, required: bool = True) -> Optional[int]:
    value = cfg.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ToolError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return value


def _layer_windows(cfg: dict, layers: int, where: str) -> tuple:
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ToolError(f"{where}: 'layer_types' must list one entry per layer ({layers})")
        if "sliding_attention" in types:
            window = _positive_int(cfg, "sliding_window", where)
        return tuple(window if t == "sliding_attention" else None for t in types)
    if window is None or cfg.get("use_sliding_window") is False:
        return (None,) * layers
    window = _positive_int(cfg, "sliding_window", where)
    if "max_window_layers" in cfg:
        first = _positive_int(cfg, "max_window_layers", where)
        return tuple(window if i >= first else None for i in range(layers))
    if "sliding_window_pattern" in cfg:
        pattern = _positive_int(cfg, "sliding_window_pattern", where)
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(layers))
    if cfg.get("model_type") == "gemma2":
        return tuple(window if i % 2 == 0 else None for i in range(layers))
    return (window,) * layers


def model_from_config(cfg: dict, name: str, where: str = "config") -> ModelShape:
    """Builds a ModelShape from a Hugging Face config dict (multimodal configs: their `text_config`).

    Raises:
      ToolError: a required field is missing or not a positive integer.
    """
    if not isinstance(cfg, dict):
        raise ToolError(f"{where}: expected a JSON object")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    layers = _positive_int(cfg, "num_hidden_layers", where)
    windows = _layer_windows(cfg, layers, where)
    if cfg.get("kv_lora_rank") is not None:
        dim = _positive_int(cfg, "kv_lora_rank", where) + _positive_int(cfg, "qk_rope_head_dim", where)
        return ModelShape(name, "MLA", layers, None, None, dim, windows)
    heads = _positive_int(cfg, "num_attention_heads", where)
    kv = _positive_int(cfg, "num_key_value_heads", where, required=False) or heads
    head_dim = _positive_int(cfg, "head_dim", where, required=False)
    if head_dim is None:
        hidden = _positive_int(cfg, "hidden_size", where)
        if hidden % heads:
            raise ToolError(f"{where}: hidden_size {hidden} is not a multiple of {heads} heads; give head_dim")
        head_dim = hidden // heads
    kind = "MHA" if kv == heads else ("MQA" if kv == 1 else "GQA")
    return ModelShape(name, kind, layers, kv, head_dim, None, windows)


def load_model(model: Optional[str] = None, config: Optional[str] = None) -> ModelShape:
    """A model from a preset name or a config.json path (exactly one of them).

    Raises:
      ToolError: neither or both given, unknown preset, unreadable or invalid config file.
    """
    if (model is None) == (config is None):
        raise ToolError("give exactly one of --model PRESET or --config config.json")
    if model is not None:
        name, cfg = get_preset(model)
        return model_from_config(cfg, name, where=f"preset {name}")
    try:
        with open(config, "r", encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError as e:
        raise ToolError(f"config {config}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ToolError(f"config {config}: not valid JSON ({e})") from None
    name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    return model_from_config(cfg, name or config, where=config)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a KV dtype name (case-insensitive). Raises ToolError for an unknown name."""
    key = dtype.strip().lower()
    if key not in DTYPE_BYTES:
        raise ToolError(f"unknown dtype {dtype!r} (choose from fp32, bf16, fp16, fp8)")
    return DTYPE_BYTES[key]


def kv_bytes(shape: ModelShape, dtype: str, tokens: int, tp: int = 1) -> int:
    """Bytes of KV cache for one request of `tokens` tokens (sliding layers capped at their window), per rank."""
    per = shape.elements_per_layer_token(tp) * dtype_bytes(dtype)
    return sum(per * (tokens if w is None else min(tokens, w)) for w in shape.layer_windows)


def bytes_per_token(shape: ModelShape, dtype: str = "bf16", tp: int = 1) -> int:
    """Bytes of one token held in every layer, per rank (the whole model when tp=1)."""
    return shape.elements_per_layer_token(tp) * dtype_bytes(dtype) * shape.num_layers


@dataclass(frozen=True)
class KVCacheSize:
    """Result of the calculator; `to_json` gives the stable `--json` object."""

    model: str
    attention: str
    description: str
    dtype: str
    dtype_bytes: int
    tp: int
    block_size: int
    bytes_per_token: int
    bytes_per_block: int
    tokens_per_gib: int
    bytes_per_token_per_gpu: int
    tokens: Optional[int]
    request_bytes: Optional[int]
    request_bytes_per_gpu: Optional[int]

    def to_json(self) -> dict:
        return dict(self.__dict__)


def calculate(shape: ModelShape, dtype: str = "bf16", block_size: int = DEFAULT_BLOCK_SIZE,
              tokens: Optional[int] = None, tp: int = 1) -> KVCacheSize:
    """KV bytes per token, per block, per request of `tokens` tokens and tokens per GiB.

    Raises:
      ToolError: bad dtype, block size or tp.
    """
    if block_size < 1:
        raise ToolError(f"--block-size must be >= 1, got {block_size}")
    per_token = bytes_per_token(shape, dtype)
    return KVCacheSize(
        model=shape.name, attention=shape.attention, description=shape.describe(), dtype=dtype.lower(),
        dtype_bytes=dtype_bytes(dtype), tp=tp, block_size=block_size, bytes_per_token=per_token,
        bytes_per_block=kv_bytes(shape, dtype, block_size), tokens_per_gib=GIB // per_token,
        bytes_per_token_per_gpu=bytes_per_token(shape, dtype, tp), tokens=tokens,
        request_bytes=None if tokens is None else kv_bytes(shape, dtype, tokens),
        request_bytes_per_gpu=None if tokens is None else kv_bytes(shape, dtype, tokens, tp))


# ---- command line -------------------------------------------------------------------------------------------------

def register(subparsers) -> None:
    p = subparsers.add_parser(
        "kvcache-size", help="KV-cache bytes per token/block/request for a model",
        description="KV-cache size of a model (built-in preset or Hugging Face config.json): bytes per token, per "
                    "block, per request, tokens per GiB of pool.",
        epilog="example: mooncake kvcache-size --model llama-3-70b --tokens 128000 --tp 8")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="PRESET", help="built-in model (see --list-models)")
    src.add_argument("--config", metavar="PATH", help="Hugging Face config.json of the model")
    src.add_argument("--list-models", action="store_true", help="list the built-in presets and exit")
    p.add_argument("--dtype", default="bf16", help="KV element type: fp32, bf16, fp16, fp8 (default bf16)")
    p.add_argument("--tokens", metavar="N", help="also size one request of N tokens (e.g. 128000 or 1.28e5)")
    p.add_argument("--block-size", metavar="TOKENS", default=str(DEFAULT_BLOCK_SIZE),
                   help=f"tokens per KV block (default {DEFAULT_BLOCK_SIZE})")
    p.add_argument("--tp", metavar="N", default="1", help="tensor-parallel ranks, for per-GPU bytes (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _list_models(dtype: str, as_json: bool) -> str:
    rows = []
    for name in preset_names():
        shape = load_model(model=name)
        rows.append({"model": name, "source": PRESETS[name][0], "attention": shape.attention,
                     "layers": shape.num_layers, "description": shape.describe(),
                     "bytes_per_token": bytes_per_token(shape, dtype)})
    if as_json:
        return json.dumps(rows, indent=2)
    return format_table(["model", "attention", "layers", f"KiB/token ({dtype})", "source"],
                        [[r["model"], r["attention"], r["layers"], f"{r['bytes_per_token'] / 1024:.2f}",
                          r["source"]] for r in rows])


def run(args: argparse.Namespace) -> int:
    """Executes `mooncake kvcache-size`; prints a table or the JSON object on stdout."""
    dtype_bytes(args.dtype)
    if args.list_models:
        print(_list_models(args.dtype.lower(), args.json))
        return 0
    shape = load_model(args.model, args.config)
    tokens = None if args.tokens is None else parse_count(args.tokens, "--tokens")
    tp = parse_count(args.tp, "--tp")
    result = calculate(shape, args.dtype, parse_count(args.block_size, "--block-size"), tokens, tp)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    rows = [["model", result.model], ["shape", result.description],
            ["dtype", f"{result.dtype} ({result.dtype_bytes} B/element)"],
            ["bytes per token", f"{result.bytes_per_token:,} B ({human_bytes(result.bytes_per_token)})"],
            [f"bytes per block ({result.block_size} tokens)",
             f"{result.bytes_per_block:,} B ({human_bytes(result.bytes_per_block)})"],
            ["tokens per GiB", f"{result.tokens_per_gib:,}"]]
    if tokens is not None:
        rows.append([f"request of {tokens:,} tokens",
                     f"{result.request_bytes:,} B ({human_bytes(result.request_bytes)})"])
    if tp > 1:
        rows.append([f"per GPU (tp={tp}), per token", f"{result.bytes_per_token_per_gpu:,} B "
                                                       f"({human_bytes(result.bytes_per_token_per_gpu)})"])
        if tokens is not None:
            rows.append([f"per GPU (tp={tp}), request", human_bytes(result.request_bytes_per_gpu)])
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0

