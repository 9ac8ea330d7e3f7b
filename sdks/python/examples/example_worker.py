"""The example worker as a script: `python examples/example_worker.py [group]`.

The jobs live in `chime_worker.example` (also runnable as `python -m chime_worker.example`).
"""

from chime_worker.example import main

if __name__ == "__main__":
    main()
