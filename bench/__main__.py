"""``python -m bench``: the benchmark suite (:mod:`bench.suite`)."""
from bench.suite import main

if __name__ == "__main__":
    main()
