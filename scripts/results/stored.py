"""The bulky keys of result records (per-block losses, every pair's paired differences) out of the tree and back.

    # the per-block numbers of a folder as one columnar file, exact (outside the tree; needs git history)
    python scripts/results/stored.py export docs/results/length OUT_DIR     # OUT_DIR/per_block.npz + per_block.json
    # strip the bulky keys of records committed at COMMIT (how docs/results/length was made small)
    python scripts/results/stored.py strip docs/results/length COMMIT length-1/ood-built-in.json ...

A reader gets a whole record with `tupe.io.results.load_result(path)` (docs/RESULTS.md, "Results in the
repository").
"""

from __future__ import annotations

import argparse
import sys

from tupe.io.results import export_arrays, strip_folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="a folder's per-block numbers as per_block.npz + per_block.json")
    e.add_argument("folder")
    e.add_argument("out")
    s = sub.add_parser("strip", help="strip the bulky keys of files as committed at COMMIT")
    s.add_argument("folder")
    s.add_argument("commit")
    s.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    if args.command == "export":
        print(export_arrays(args.folder, args.out))
    else:
        strip_folder(args.folder, args.commit, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
