"""PartialEmbedding(combiner=...) on a parameter-server cluster of real processes.

Run as a script in its own process: a cluster of 2 parameter servers and 2
workers (``partial_embedding.examples.parameter_server``, each task a process
on the loopback address) trains a table split into shards, bags pooled by the
layer, ``MaskedOptimizer(Adam)``, one step at a time; the same steps on one
machine give the same table, and frozen rows keep their bits.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pe_testing import case_seed, run_script_report, seed_environment


def _main() -> None:
    from partial_embedding.examples import parameter_server as example

    seed = case_seed("test_embedding_bags_cluster") % (2**31)
    config = example.Config(
        vocab=600, dim=8, batch=16, sequential=True, seed=seed, steps=5, combiner="sqrtn"
    )
    with example.local_cluster() as cluster:
        result = example.train_on_cluster(config, cluster)
    reference = example.train_single_machine(config)[config.steps]
    initial, permitted, _ = example.initial_state(config)
    table = result["table"]
    print(
        json.dumps(
            {
                "steps": result["steps"],
                "shard_rows": result["shard_rows"],
                "frozen_rows_bit_exact": result["frozen_rows_bit_exact"],
                "frozen_equal_initial": bool(
                    np.array_equal(
                        table[~permitted].view(np.uint32), initial[~permitted].view(np.uint32)
                    )
                ),
                "equal_to_one_machine": bool(np.allclose(table, reference, 1e-5, 1e-7)),
                "trained": bool((table[permitted] != initial[permitted]).any()),
            }
        )
    )


@pytest.mark.slow
def test_parameter_server_cluster_matches_one_machine() -> None:
    report = run_script_report(os.path.abspath(__file__), seed_environment(), timeout=300)
    assert report["steps"] == 5
    assert report["shard_rows"] == [300, 300]
    assert report["frozen_rows_bit_exact"] and report["frozen_equal_initial"]
    assert report["equal_to_one_machine"]
    assert report["trained"]


if __name__ == "__main__":
    sys.exit(_main())
