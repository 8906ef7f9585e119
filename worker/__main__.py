"""``python -m worker``: the one entrypoint for every role."""

from worker.cli import main

if __name__ == "__main__":
    main()
