"""``python -m partial_embedding.demo [--lm|--keras-hub]``."""

import sys

from partial_embedding.demo import main

if __name__ == "__main__":
    sys.exit(main())
