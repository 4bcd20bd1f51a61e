"""The proxy video model bundled with rotvid: a small diffusers ``WanPipeline`` trained on procedural clips.

``load_pipeline("proxy")`` / ``rotvid ... --model proxy`` load it from the package, offline. It is
no good at video; it exists so that whole-model fidelity (quantization and rotation error in
pixels) is measured on *learned* attention rather than random weights, on any machine.

* :mod:`.clips` — the procedural clips and the prompt grammar (seeded);
* :mod:`.probe` — the automatic check that a clip shows its prompt (colour and motion);
* :mod:`.build` — the components' configs, the tokenizer, the bundled folder and its checksums;
* :mod:`.train` — the training command (VAE, then transformer + text encoder by flow matching);
* :mod:`.attention_stats` — row entropy and spatio-temporal locality of the self-attention.
"""

from rotvid.pipelines.proxy.build import PROXY_DIR, verify_proxy
from rotvid.pipelines.proxy.clips import prompt_of, render_clips, sample_specs
from rotvid.pipelines.proxy.probe import ProbeResult, probe_clip

__all__ = ["PROXY_DIR", "verify_proxy", "prompt_of", "render_clips", "sample_specs", "ProbeResult", "probe_clip"]
