"""The keras-hub integration's parts (``partial_embedding.keras_hub`` is its surface).

``backbones`` makes backbones whose graph calls a partial token embedding;
``rebuild`` rebuilds a backbone or task model around one and copies every
other weight; ``tokens`` reads ``new_tokens`` and extends tokenizers;
``preset`` writes the merged, plain keras-hub preset. Importing any of them
imports keras-hub.
"""
