"""The training command end to end at a toy size on the CPU (seconds): it writes a loadable, checksummed proxy."""

import json

import pytest
import torch

from rotvid.pipelines.loading import load_pipeline
from rotvid.pipelines.proxy.build import verify_proxy
from rotvid.pipelines.proxy.train import encode_prompts, main, parse_args

TOY = ["--vae-steps", "2", "--vae-batch", "1", "--vae-size", "32", "--vae-frames", "5", "--stats-clips", "1",
       "--clips-128", "2", "--low-size", "32", "--clips-256", "0", "--encode-batch", "2", "--dit-steps", "2",
       "--dit-batch", "2", "--probe-prompts", "1", "--probe-size", "32", "--probe-frames", "5", "--probe-steps", "1",
       "--recon-probe", "1", "--device", "cpu", "--log-every", "1"]


def test_train_writes_a_proxy_folder(tmp_path):
    posterior = "sample"  # the other branch: "mode" (the default) made the bundled weights on the GPU; the
    # two-run test below takes the default
    record = main(["--out", str(tmp_path), "--seed", "3", "--vae-posterior", posterior, *TOY])
    assert record["vae"]["steps"] == 2 and record["transformer"]["steps"] == 2
    assert record["quick_probe"]["prompts"] == 1 and 0 <= record["quick_probe"]["rate"] <= 1
    recon = record["reconstruction_probe"]  # the probe on the VAE's reconstructions of held-out clips
    assert recon["clips"] == 1 and recon["passed"] in (0, 1) and 0 < recon["mse"] < 4
    folder = tmp_path / "proxy"
    verify_proxy(folder)
    training = json.loads((folder / "training.json").read_text())
    assert training["seed"] == 3 and "--vae-posterior " + posterior in training["command"]
    pipe = load_pipeline(folder, dtype=torch.float32)
    assert pipe.transformer.config.attention_head_dim == 128
    assert pipe.transformer.dtype == torch.float32  # loaded at the asked dtype from the fp16 files


def test_vae_and_transformer_in_two_runs(tmp_path):
    main(["--out", str(tmp_path / "v"), "--vae-only", *TOY])
    assert (tmp_path / "v" / "vae" / "config.json").is_file() and not (tmp_path / "v" / "proxy").exists()
    record = main(["--out", str(tmp_path / "t"), "--vae-from", str(tmp_path / "v" / "vae"), *TOY])
    assert record["vae"] == {"from": str(tmp_path / "v" / "vae")} and record["transformer"]["steps"] == 2
    verify_proxy(tmp_path / "t" / "proxy")


def test_training_text_embeddings_match_the_pipelines(tmp_path):
    from rotvid.pipelines.proxy.build import assemble_pipeline, build_text_encoder, build_transformer, build_vae

    torch.manual_seed(0)
    pipe = assemble_pipeline(build_vae(), build_transformer(), build_text_encoder().eval())
    prompts = ["a red circle moves to the right", ""]
    ours = encode_prompts(pipe.tokenizer, pipe.text_encoder, prompts, "cpu")
    theirs = pipe._get_t5_prompt_embeds(prompts, max_sequence_length=16, device=torch.device("cpu"))
    torch.testing.assert_close(ours, theirs)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--vae-frames", "6"])
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--dit-batch", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--vae-object-weight", "-1"])
