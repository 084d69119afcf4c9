import json

import pytest

from mooncake.tools.common import ToolError
from mooncake.tools.kvcache_size import (bytes_per_token, calculate, kv_bytes, load_model, model_from_config)
from mooncake.tools.presets import PRESETS, get_preset

# Hand-computed bf16 bytes per token: layers * 2 (K,V) * kv_heads * head_dim * 2 B, or layers * (512 + 64) * 2 B
# for MLA, from each model's published config.json.
EXPECTED_BF16 = {
    "llama-2-7b": 32 * 2 * 32 * 128 * 2,
    "llama-2-13b": 40 * 2 * 40 * 128 * 2,
    "llama-2-70b": 80 * 2 * 8 * 128 * 2,
    "llama-3-8b": 32 * 2 * 8 * 128 * 2,
    "llama-3-70b": 80 * 2 * 8 * 128 * 2,
    "llama-3.1-405b": 126 * 2 * 8 * 128 * 2,
    "llama-3.2-1b": 16 * 2 * 8 * 64 * 2,
    "llama-3.2-3b": 28 * 2 * 8 * 128 * 2,
    "qwen2.5-7b": 28 * 2 * 4 * 128 * 2,
    "qwen2.5-72b": 80 * 2 * 8 * 128 * 2,
    "qwen3-8b": 36 * 2 * 8 * 128 * 2,
    "qwen3-32b": 64 * 2 * 8 * 128 * 2,
    "qwen3-235b-a22b": 94 * 2 * 4 * 128 * 2,
    "mistral-7b-v0.1": 32 * 2 * 8 * 128 * 2,
    "mixtral-8x7b": 32 * 2 * 8 * 128 * 2,
    "gemma-2-9b": 42 * 2 * 8 * 256 * 2,
    "gemma-3-27b": 62 * 2 * 16 * 128 * 2,
    "deepseek-v2": 60 * 576 * 2,
    "deepseek-v2-lite": 27 * 576 * 2,
    "deepseek-v3": 61 * 576 * 2,
    "kimi-k2": 61 * 576 * 2,
}


def test_every_preset_has_a_hand_computed_size():
    assert set(EXPECTED_BF16) == set(PRESETS)


@pytest.mark.parametrize("name, expected", sorted(EXPECTED_BF16.items()))
def test_preset_bytes_per_token(name, expected):
    assert bytes_per_token(load_model(model=name), "bf16") == expected


def test_llama3_70b_bf16_is_320_kib_per_token():
    r = calculate(load_model(model="llama-3-70b"), "bf16", block_size=512, tokens=128_000)
    assert r.bytes_per_token == 320 * 1024
    assert r.bytes_per_block == 320 * 1024 * 512
    assert r.request_bytes == 320 * 1024 * 128_000
    assert r.tokens_per_gib == (1 << 30) // (320 * 1024) == 3276
    assert r.attention == "GQA"


@pytest.mark.parametrize("dtype, factor", [("fp32", 2.0), ("fp16", 1.0), ("BF16", 1.0), ("fp8", 0.5)])
def test_dtypes(dtype, factor):
    assert bytes_per_token(load_model(model="llama-3-8b"), dtype) == 131072 * factor


def test_unknown_dtype_and_block_size():
    shape = load_model(model="llama-3-8b")
    with pytest.raises(ToolError, match="unknown dtype"):
        bytes_per_token(shape, "int3")
    with pytest.raises(ToolError, match="block-size"):
        calculate(shape, block_size=0)


@pytest.mark.parametrize("alias", ["meta-llama/Meta-Llama-3-70B", "Llama-3.1-70B", "LLAMA_3.3_70B"])
def test_aliases(alias):
    assert get_preset(alias)[0] == "llama-3-70b"


def test_unknown_model_suggests_close_names():
    with pytest.raises(ToolError, match=r"unknown model 'llama-3-7b'.*did you mean.*llama-3-70b"):
        load_model(model="llama-3-7b")


def test_tensor_parallel_split():
    shape = load_model(model="llama-3-70b")
    assert bytes_per_token(shape, "bf16", tp=8) == 327680 // 8
    assert bytes_per_token(shape, "bf16", tp=16) == 327680 // 8  # 8 KV heads: each of 16 ranks keeps one
    with pytest.raises(ToolError, match="does not divide"):
        bytes_per_token(shape, "bf16", tp=3)
    mla = load_model(model="deepseek-v3")
    assert bytes_per_token(mla, "bf16", tp=8) == 61 * 576 * 2  # the latent is replicated


def test_config_attention_kinds():
    mha = model_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}, "m")
    assert (mha.attention, mha.num_kv_heads, mha.head_dim) == ("MHA", 4, 64)
    mqa = model_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
                             "hidden_size": 256}, "m")
    assert mqa.attention == "MQA" and bytes_per_token(mqa, "fp16") == 2 * 2 * 1 * 64 * 2
    mla = model_from_config({"num_hidden_layers": 3, "kv_lora_rank": 100, "qk_rope_head_dim": 28}, "m")
    assert mla.attention == "MLA" and bytes_per_token(mla, "fp8") == 3 * 128
    nested = model_from_config({"text_config": {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                "head_dim": 8}}, "m")
    assert bytes_per_token(nested, "fp32") == 2 * 2 * 2 * 8 * 4


def test_sliding_window_layers_cap_long_requests():
    base = {"num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}
    per_layer_token = 2 * 1 * 8 * 2  # bf16
    every = model_from_config(dict(base, sliding_window=100), "mistral-like")
    assert kv_bytes(every, "bf16", 1000) == 4 * 100 * per_layer_token
    assert kv_bytes(every, "bf16", 50) == 4 * 50 * per_layer_token
    qwen = model_from_config(dict(base, sliding_window=100, use_sliding_window=True, max_window_layers=2), "q")
    assert kv_bytes(qwen, "bf16", 1000) == (2 * 1000 + 2 * 100) * per_layer_token
    off = model_from_config(dict(base, sliding_window=100, use_sliding_window=False, max_window_layers=2), "q")
    assert kv_bytes(off, "bf16", 1000) == 4 * 1000 * per_layer_token
    typed = model_from_config(dict(base, sliding_window=10, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"]), "g")
    assert kv_bytes(typed, "bf16", 1000) == (2 * 1000 + 2 * 10) * per_layer_token


def test_gemma_presets_window_layout():
    gemma2 = load_model(model="gemma-2-9b")
    assert kv_bytes(gemma2, "bf16", 8192) == (21 * 8192 + 21 * 4096) * 2 * 8 * 256 * 2
    gemma3 = load_model(model="gemma-3-27b")
    assert sum(w is None for w in gemma3.layer_windows) == 10  # every 6th of 62 layers is global
    by_pattern = model_from_config({"num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
                                    "head_dim": 128, "sliding_window": 1024, "sliding_window_pattern": 6}, "g3")
    assert by_pattern.layer_windows == gemma3.layer_windows


@pytest.mark.parametrize("cfg, message", [
    ({"num_attention_heads": 2}, "'num_hidden_layers' must be a positive integer"),
    ({"num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 8}, "'num_attention_heads'"),
    ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 8}, "not a multiple"),
    ({"num_hidden_layers": 2, "kv_lora_rank": 8}, "'qk_rope_head_dim'"),
    ({"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 4, "layer_types": ["full_attention"]},
     "one entry per layer"),
])
def test_invalid_configs(cfg, message):
    with pytest.raises(ToolError, match=message):
        model_from_config(cfg, "m")


def test_config_files(tmp_path):
    good = tmp_path / "config.json"
    good.write_text(json.dumps({"_name_or_path": "my/model", "num_hidden_layers": 80, "num_attention_heads": 64,
                                "num_key_value_heads": 8, "hidden_size": 8192}))
    shape = load_model(config=str(good))
    assert shape.name == "my/model" and bytes_per_token(shape) == 327680
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ToolError, match="not valid JSON"):
        load_model(config=str(bad))
    with pytest.raises(ToolError, match="No such file"):
        load_model(config=str(tmp_path / "absent.json"))
    with pytest.raises(ToolError, match="exactly one"):
        load_model()
