"""``specpilot w12 ...``: convert a checkpoint to W12 and verify a converted one.

    specpilot w12 convert SRC DST [--verify] [--dtype-check] [--shard-size GB] [--force] [--quiet]
    specpilot w12 verify DST [--quiet]

Exit status: 0 success, 1 a conversion or verification failure (the message names the tensor), 2 usage.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from w12.checkpoint import folder_entries, has_manifest, iter_w12_folder
from w12.codec import W12FormatError
from w12.convert import DEFAULT_SHARD_BYTES, convert
from w12.progress import Progress


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specpilot w12", description="Lossless 12-bit BF16 (W12) checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert a HF safetensors folder or a GGUF file into a W12 folder")
    c.add_argument("src", help="HF safetensors folder or .gguf file (GGUF is dequantized, then rounded to bf16)")
    c.add_argument("dst", help="output folder")
    c.add_argument("--verify", action="store_true", help="decode everything again and compare bit for bit")
    c.add_argument(
        "--dtype-check", action="store_true", help="refuse tensors that are not exactly representable in bf16"
    )
    c.add_argument(
        "--shard-size", type=float, default=DEFAULT_SHARD_BYTES / 2**30, help="GiB per shard (default: %(default)g)"
    )
    c.add_argument("--force", action="store_true", help="replace a W12 checkpoint already in DST")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    v = sub.add_parser(
        "verify",
        help="decode every tensor of a W12 folder and check its hashes, the manifest (tensor set, config and "
        "tokenizer files) and the tensor set the config implies",
    )
    v.add_argument("dst", help="the converted folder")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _verify(path: str, quiet: bool) -> int:
    problems: list[str] = []
    try:
        total = sum(math.prod(e.get("shape", [])) for e in folder_entries(path).values())
    except (W12FormatError, TypeError):
        total = 1  # the loop below reports what is wrong with the headers
    bar = Progress(total, "w12 verify", enabled=not quiet)
    count = 0
    for name, _, entry in iter_w12_folder(path, verify_hashes=True, problems=problems):
        count += 1
        bar.update(math.prod(entry["shape"]), name)
    bar.close(f"{count} tensors good, {len(problems)} problem(s)")
    for p in problems:
        print(f"specpilot w12 verify: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"{path}: {count} tensors decode to their stored sha256")
    if not has_manifest(path):
        print(f"{path}: note: converted before tensor digests and the manifest existed: renamed tensors, removed "
              "tensors and edited side files are not detectable; convert it again for those checks")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``specpilot w12`` with ``argv`` (without the ``w12`` word); returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "convert":
            report = convert(
                args.src,
                args.dst,
                verify=args.verify,
                exact=args.dtype_check,
                max_shard_bytes=int(args.shard_size * 2**30),
                force=args.force,
                progress=not args.quiet,
            )
            print(report.summary())
            return 0
        return _verify(args.dst, args.quiet)
    except (ValueError, OSError) as e:  # W12FormatError and the loaders' CheckpointError are ValueErrors
        message = str(e).replace("pass force=True / --force", "pass --force")  # the flag, not the argument
        print(f"specpilot w12 {args.command}: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
