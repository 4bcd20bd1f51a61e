"""rotvid.eval: videos, the paper's relative metrics against the FP16 reference, VBench, reports.

- :mod:`rotvid.eval.video_io`      H.264 mp4 through PyAV (atomic writes), probing, reading frames
- :mod:`rotvid.eval.pixel_metrics` PSNR (∞ when identical), SSIM, cosine, MSE, per-frame PSNR
- :mod:`rotvid.eval.matching`      reference/candidate videos or folders matched by name
- :mod:`rotvid.eval.report`        report.md (Table-1-like), metrics.csv/json, plots
- :mod:`rotvid.eval.vbench_runner` VBench dimensions in VBench's own environment (subprocess)
- :mod:`rotvid.eval.generation`    one video + JSON sidecar from a diffusers pipeline
- :mod:`rotvid.eval.compare` / :mod:`rotvid.eval.generated`  the two forms of ``rotvid eval``
"""
