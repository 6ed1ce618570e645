"""``python -m keepstep.app.tui DIR [RUN_ID]``: open the TUI without the CLI."""

from __future__ import annotations

import sys

from . import make_app


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m keepstep.app.tui PROJECT_DIR [RUN_ID]")
        sys.exit(0 if args else 2)
    from keepstep.engine import KeepstepError

    try:
        app = make_app(args[0], args[1] if len(args) > 1 else None)
    except KeepstepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    app.run()


if __name__ == "__main__":
    main()
