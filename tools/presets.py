"""Built-in model presets: the attention-relevant fields of each model's Hugging Face `config.json`.

Each preset is a plain config dict, parsed by the same code as a user's config file (kvcache_size.model_from_config),
so presets and files cannot disagree. Only fields that determine the KV-cache shape are kept. `source` names the
Hugging Face repository the values come from; `aliases` are other accepted names.
"""

from __future__ import annotations

import difflib

from .common import ToolError


def _alternating(layers: int, sliding_if) -> list[str]:
    return ["sliding_attention" if sliding_if(i) else "full_attention" for i in range(layers)]


def _dense(layers: int, heads: int, kv_heads: int, hidden: int, head_dim: int | None = None, **extra) -> dict:
    cfg = {"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "hidden_size": hidden}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(extra)
    return cfg


def _mla(layers: int, heads: int, hidden: int, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64) -> dict:
    return {"num_hidden_layers": layers, "num_attention_heads": heads, "hidden_size": hidden,
            "kv_lora_rank": kv_lora_rank, "qk_rope_head_dim": qk_rope_head_dim, "qk_nope_head_dim": 128,
            "v_head_dim": 128}


# name -> (source repository, aliases, config fields)
PRESETS: dict[str, tuple[str, tuple[str, ...], dict]] = {
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", ("llama2-7b",), _dense(32, 32, 32, 4096)),
    "llama-2-13b": ("meta-llama/Llama-2-13b-hf", ("llama2-13b",), _dense(40, 40, 40, 5120)),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", ("llama2-70b",), _dense(80, 64, 8, 8192)),
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", ("llama3-8b", "llama-3.1-8b", "meta-llama-3-8b"),
                   _dense(32, 32, 8, 4096)),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B",
                    ("llama3-70b", "llama-3.1-70b", "llama-3.3-70b", "meta-llama-3-70b"), _dense(80, 64, 8, 8192)),
    "llama-3.1-405b": ("meta-llama/Llama-3.1-405B", ("llama-3-405b", "llama3-405b"), _dense(126, 128, 8, 16384)),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", (), _dense(16, 32, 8, 2048, head_dim=64)),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", (), _dense(28, 24, 8, 3072, head_dim=128)),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", ("qwen-2.5-7b",),
                   _dense(28, 28, 4, 3584, sliding_window=131072, use_sliding_window=False, max_window_layers=28)),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B-Instruct", ("qwen-2.5-72b",),
                    _dense(80, 64, 8, 8192, sliding_window=131072, use_sliding_window=False, max_window_layers=80)),
    "qwen3-8b": ("Qwen/Qwen3-8B", ("qwen-3-8b",), _dense(36, 32, 8, 4096, head_dim=128)),
    "qwen3-32b": ("Qwen/Qwen3-32B", ("qwen-3-32b",), _dense(64, 64, 8, 5120, head_dim=128)),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B", ("qwen-3-235b-a22b", "qwen3-235b"),
                        _dense(94, 64, 4, 4096, head_dim=128)),
    "mistral-7b-v0.1": ("mistralai/Mistral-7B-v0.1", ("mistral-7b",),
                        _dense(32, 32, 8, 4096, sliding_window=4096)),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", ("mixtral-8x7b-instruct",), _dense(32, 32, 8, 4096)),
    "gemma-2-9b": ("google/gemma-2-9b", (),
                   _dense(42, 16, 8, 3584, head_dim=256, sliding_window=4096,
                          layer_types=_alternating(42, lambda i: i % 2 == 0))),
    "gemma-3-27b": ("google/gemma-3-27b-it", (),
                    _dense(62, 32, 16, 5376, head_dim=128, sliding_window=1024,
                           layer_types=_alternating(62, lambda i: (i + 1) % 6 != 0))),
    "deepseek-v2": ("deepseek-ai/DeepSeek-V2", (), _mla(60, 128, 5120)),
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", (), _mla(27, 16, 2048)),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", ("deepseek-r1",), _mla(61, 128, 7168)),
    "kimi-k2": ("moonshotai/Kimi-K2-Instruct", ("kimi-k2-instruct",), _mla(61, 64, 7168)),
}


def _normalize(name: str) -> str:
    name = name.strip().lower().replace("_", "-")
    return name.rsplit("/", 1)[-1]


_INDEX: dict[str, str] = {}
for _name, (_source, _aliases, _cfg) in PRESETS.items():
    for _key in (_name, _source, *_aliases):
        _INDEX[_normalize(_key)] = _name


def preset_names() -> list[str]:
    """Canonical preset names, in catalogue order."""
    return list(PRESETS)


def get_preset(name: str) -> tuple[str, dict]:
    """Returns (canonical name, config dict) for a preset name, alias or Hugging Face repository id
    (case-insensitive).

    Raises:
      ToolError: unknown model (the message suggests close names).
    """
    key = _normalize(name)
    if key in _INDEX:
        canonical = _INDEX[key]
        return canonical, dict(PRESETS[canonical][2])
    close = difflib.get_close_matches(key, list(_INDEX), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(sorted({_INDEX[c] for c in close}))}?" if close else ""
    raise ToolError(f"unknown model {name!r}{hint} (see `mooncake kvcache-size --list-models`)")
