"""``python -m training {train,distill} [options]``, from the repository root."""
from __future__ import annotations

import sys

USAGE = """usage: python -m training {train,distill} [options]

  train     train a checkpoint on the arithmetic suite's train split (training/train.py)
  distill   self-distil a block-diffusion checkpoint on its own decodes (training/distill.py)

'python -m training COMMAND --help' lists a command's options."""


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command in ("-h", "--help"):
        print(USAGE)
        return 0
    if command == "train":
        from training import train

        train.main(rest)
    elif command == "distill":
        from training import distill

        distill.main(rest)
    else:
        print(USAGE, file=sys.stderr)
        print(f"\npython -m training: expected a command, train or distill, got {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
