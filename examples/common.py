"""What the example trainers share and that does not touch the framework: the text they train on and the command
line flags that make runs comparable across frameworks (start from a saved state, evaluate only)."""

from __future__ import annotations

import argparse
from pathlib import Path

TEXT = Path(__file__).resolve().parent.parent / "tilewise" / "data" / "kjv.txt"


def read_text(limit: int | None = None) -> str:
    text = TEXT.read_text(encoding="utf-8")
    return text[:limit] if limit else text


def add_run_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--out", default="out", help="folder for checkpoints")
    parser.add_argument("--init-from", default=None, help="start from this model state dict (a .pt file)")
    parser.add_argument("--save-init", default=None, help="write the freshly initialised state dict here and stop")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt (model, optimizer, step)")
    parser.add_argument("--eval-only", action="store_true", help="print the validation loss and stop")
    return parser
