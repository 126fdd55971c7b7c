"""``python -m partial_embedding.bench [--quick|--full|--memory|--training [--admission]|...]``."""

from partial_embedding.bench import main

if __name__ == "__main__":
    main()
