"""`python -m qnnctl`."""

from qnnctl.launch import main

if __name__ == "__main__":
    main()
