"""Runs VBench inside VBench's own Python environment (started by :mod:`rotvid.eval.vbench`).

This file is executed as a script by the VBench environment's interpreter, which does not have
rotvid installed: it imports only the standard library and ``vbench``. It evaluates the videos
of one folder in VBench's ``custom_input`` mode and writes the scores as JSON:

    {"dimensions": {DIM: {"mean": float, "videos": {FILE_NAME: float}}}, "vbench_version": str}

Exit codes: 0 done, 3 ``vbench`` cannot be imported (the message says why), 4 VBench failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

# Run as a script, this file's folder (rotvid/eval) is first on sys.path: drop it, so that
# ``import vbench`` finds the VBench package and nothing of rotvid's.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--videos", required=True, help="folder of .mp4 videos")
    ap.add_argument("--prompts", required=True, help="JSON file {video file name: prompt}")
    ap.add_argument("--dimensions", required=True, help="comma-separated VBench dimensions")
    ap.add_argument("--work", required=True, help="folder for VBench's own outputs")
    ap.add_argument("--result", required=True, help="where to write the scores JSON")
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    args = ap.parse_args(argv)

    try:
        import torch
        import vbench
        from vbench import VBench
    except Exception as exc:  # report any import failure in one line, then its traceback
        print(f"vbench cannot be imported in {sys.executable}: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        return 3

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dims = [d for d in args.dimensions.split(",") if d]
    with open(args.prompts, encoding="utf-8") as f:
        prompts = json.load(f)
    full_info = os.path.join(os.path.dirname(os.path.abspath(vbench.__file__)), "VBench_full_info.json")
    os.makedirs(args.work, exist_ok=True)
    name = "rotvid"
    try:
        bench = VBench(torch.device(device), full_info, args.work)
        bench.evaluate(
            videos_path=os.path.abspath(args.videos),
            name=name,
            prompt_list=prompts,
            dimension_list=dims,
            local=True,
            mode="custom_input",
        )
    except Exception as exc:
        print(f"VBench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        return 4
    with open(os.path.join(args.work, f"{name}_eval_results.json"), encoding="utf-8") as f:
        raw = json.load(f)
    try:
        from importlib.metadata import version

        vbench_version = version("vbench")
    except Exception:
        vbench_version = "unknown"
    out = {"dimensions": {}, "vbench_version": vbench_version, "device": device}
    for dim, value in raw.items():
        mean, per_video = value[0], value[1]
        videos = {}
        for item in per_video:
            score = item.get("video_results")
            if isinstance(score, (int, float)):
                videos[os.path.basename(item["video_path"])] = float(score)
        out["dimensions"][dim] = {"mean": float(mean), "videos": videos}
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
