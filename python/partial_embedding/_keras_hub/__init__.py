"""The keras-hub integration's parts (``partial_embedding.keras_hub`` is its surface).

``backbones`` makes backbones whose graph calls a partial token embedding;
``rebuild`` rebuilds a backbone or task model around one and copies every
other weight; ``tokens`` reads ``new_tokens`` and extends tokenizers;
``preset`` writes the merged, plain keras-hub preset. Importing any of them
imports keras-hub.
"""

try:
    import keras_hub  # noqa: F401
except ImportError as error:
    raise ImportError(
        "partial_embedding.keras_hub needs keras-hub and tensorflow-text: "
        'pip install "tf-partial-embedding[keras-hub]"'
    ) from error
