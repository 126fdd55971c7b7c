"""What several subpackages share; imports nothing above it.

``row_mask`` (the layer/optimizer contract on the variable), ``framework_private``
(every private Keras and TensorFlow member the package uses, checked),
``variables``, ``xla``, ``checks``, ``context``, ``safetensors`` (the strict
safetensors codec) and ``types``. Nothing here is
public API.
"""
