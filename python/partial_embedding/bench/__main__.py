"""``python -m partial_embedding.bench [--quick|--full|--memory|--training [--admission]|...]``.

``--gpu-host-table`` (issue #45's table larger than the GPU, ``bench._gpu_host_table``)
is picked here, before the other benchmarks' choice in ``bench.main``.
"""

import sys

from partial_embedding.bench import main

if __name__ == "__main__":
    if "--gpu-host-table" in sys.argv[1:]:
        from partial_embedding.bench import _gpu_host_table

        _gpu_host_table.main([flag for flag in sys.argv[1:] if flag != "--gpu-host-table"])
    else:
        main()
