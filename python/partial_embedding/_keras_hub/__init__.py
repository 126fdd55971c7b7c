"""The keras-hub integration's parts (``partial_embedding.keras_hub`` is its surface).

Importing any of them imports keras-hub.
"""

try:
    import keras_hub  # noqa: F401
except ImportError as error:
    raise ImportError(
        "partial_embedding.keras_hub needs keras-hub and tensorflow-text: "
        'pip install "tf-partial-embedding[keras-hub]"'
    ) from error
