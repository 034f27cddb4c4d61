"""Zero-shot cross-lingual transfer: fine-tune on English NLI, select on English dev, test on
every XNLI language over several seeds, and write JSON / Markdown / HTML reports."""
from __future__ import annotations

import sys

from pretrain.cli import Commands, dispatch

COMMANDS: Commands = {
    "xnli": ("xeval.xnli", "fine-tune on English NLI, select on dev, test all XNLI languages, write a report"),
    "report": ("xeval.report", "re-render reports from results.json files, several runs side by side"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m xeval", __doc__ or "", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
