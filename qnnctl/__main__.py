"""`python -m qnnctl`."""

from qnnctl.cli import main

if __name__ == "__main__":
    main()
