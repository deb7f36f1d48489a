"""``python -m auturi.cli``: the same as the ``auturi`` console script."""
from auturi.cli import main

if __name__ == "__main__":
    main()
