"""``python -m gateway`` runs the command-line interface."""

from gateway.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
