"""``python -m partial_embedding.demo [--lm]``."""

import sys

from partial_embedding.demo import main

sys.exit(main())
