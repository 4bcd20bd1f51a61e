"""The bundled proxy model: checksums, offline loading, a 128x128 generation on the CPU (time-boxed)."""

import json
import time

import pytest
import torch

from rotvid.pipelines.loading import load_pipeline, resolve_model
from rotvid.pipelines.model_table import MODELS
from rotvid.pipelines.proxy.build import (
    CHECKSUMS_FILE, PROXY_CALL_DEFAULTS, PROXY_DIR, TRANSFORMER_CONFIG, file_checksums, proxy_tokenizer, verify_proxy,
)
from rotvid.pipelines.proxy.clips import VOCABULARY


def test_weights_match_their_checksums_and_size():
    sums = verify_proxy()
    assert {"model_index.json", "transformer/diffusion_pytorch_model.safetensors",
            "vae/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
            "tokenizer/tokenizer.json"} <= set(sums)
    total = sum((PROXY_DIR / name).stat().st_size for name in sums)
    assert total <= 30 * 2**20  # the budget: 30 MB in all


def test_verify_proxy_names_a_changed_file(tmp_path):
    import shutil

    copy = tmp_path / "proxy"
    shutil.copytree(PROXY_DIR, copy)
    verify_proxy(copy)
    (copy / "scheduler" / "scheduler_config.json").write_text("{}")
    with pytest.raises(ValueError, match="scheduler/scheduler_config.json"):
        verify_proxy(copy)
    (copy / CHECKSUMS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=CHECKSUMS_FILE):
        verify_proxy(copy)
    assert set(file_checksums(copy)) == set(file_checksums(PROXY_DIR))  # checksums.json is never listed


def test_proxy_is_the_bundled_local_entry_of_the_model_table():
    entry = MODELS["proxy"]
    assert entry.bundled and entry.family == "wan" and entry.preset == "none"
    source, is_local = resolve_model("proxy")
    assert is_local and source == str(PROXY_DIR) and resolve_model("PROXY") == (source, True)
    index = json.loads((PROXY_DIR / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index["transformer"][1] == "WanTransformer3DModel"


def test_tokenizer_covers_the_grammar():
    tok = proxy_tokenizer()
    ids = tok("a red circle moves to the right on a blue background").input_ids
    assert tok.unk_token_id not in ids and ids[-1] == tok.eos_token_id
    assert len(tok) == len(VOCABULARY) + 3


@pytest.fixture(scope="module")
def proxy_pipe():
    import os

    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # no network: everything must come from the package
    try:
        yield load_pipeline("proxy", dtype=torch.float32)
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old


def test_loads_offline_as_a_wan_pipeline_with_head_dim_128(proxy_pipe):
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    assert isinstance(proxy_pipe, WanPipeline)
    assert isinstance(proxy_pipe.transformer, WanTransformer3DModel)
    assert isinstance(proxy_pipe.vae, AutoencoderKLWan)
    cfg = proxy_pipe.transformer.config
    assert cfg.attention_head_dim == 128 and cfg.num_layers == TRANSFORMER_CONFIG["num_layers"]
    assert proxy_pipe.vae.config.latents_std != [1.0] * 16  # trained latent statistics, not the defaults


def test_generates_128x128_on_the_cpu_within_a_minute(proxy_pipe):
    kw = dict(PROXY_CALL_DEFAULTS, num_inference_steps=2)
    t = time.process_time()  # CPU time of this process: the work done, not the wait on a shared machine
    video = proxy_pipe(prompt="a red circle moves to the right", generator=torch.Generator().manual_seed(0),
                       output_type="np", **kw).frames[0]
    cpu_seconds = time.process_time() - t
    assert video.shape == (17, 128, 128, 3)
    assert float(video.min()) >= 0 and float(video.max()) <= 1 and float(video.std()) > 0
    # a minute of wall time on two cores
    assert cpu_seconds < 120, f"128x128, 2 steps took {cpu_seconds:.1f} CPU seconds"


def test_hub_failure_points_to_a_folder_or_the_proxy(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="--model proxy"):
        load_pipeline("nobody-here/no-such-model", local_files_only=True)
