"""`lad serve`: debiased choices over HTTP on vLLM's async engine (lad.run.serve)."""

from __future__ import annotations

import argparse

from lad.cli.flags import (
    InputPath,
    add_image_flags,
    add_lad_flags,
    add_settings,
    add_whole,
    command,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "serve", _serve)
    add_settings(p, "model", help="hub id, local path or 'demo'")
    add_settings(p, "trust_remote_code", "dtype", "labels")
    for name, what in (("prompt_template", "prompt text"), ("chat_template", "Jinja file")):
        add_settings(p, name, help=f"as lad predict's ({what})")
    add_image_flags(p)
    add_settings(p, "calibration", required=True, help="calibration.json (lad calibrate)")
    p.add_argument(
        "--image-root",
        type=InputPath,
        default=".",
        metavar="DIR",
        help="the one folder requests' picture paths may name, symlinks resolved (default: .)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    add_whole(p, "--port", minimum=1, default=8000, help="port to listen on")
    add_whole(p, "--max-queue", minimum=1, default=64, help="requests in flight before 503")
    add_lad_flags(p)
    p.set_defaults(engine="vllm", device="auto", quiet=True, repetition_penalty=None)


def _serve(args: argparse.Namespace) -> int:
    """serve debiased N-way choices over HTTP (vLLM)

    Load the model in vLLM's async engine and answer POST /choose with JSON {"query" or
    "question", "images" (paths inside --image-root) or "texts"}: lad predict --json's answer.
    Concurrent requests are batched by the engine; past --max-queue in flight the answer is 503.
    docs/backends.md, 'Serving'.

    Example:
        lad serve --model Qwen/Qwen2.5-VL-3B-Instruct --calibration cal.json --port 8000
        curl -s localhost:8000/choose -d '{"query": "a red circle", "images": \\
            ["a.png", "b.png", "c.png", "d.png"]}'
    """
    from lad.cli.run import calibrated_debiaser
    from lad.run.serve import serve

    debiaser = calibrated_debiaser(args)
    serve(
        debiaser,
        host=args.host,
        port=args.port,
        max_queue=args.max_queue,
        image_root=args.image_root,
    )
    return 0
