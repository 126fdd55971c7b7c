"""Version of this package and the TensorFlow release its op library needs."""

__version__ = "0.1.0"

#: The op library is compiled against one TensorFlow minor release and loads
#: only into that one.
REQUIRED_TENSORFLOW = "2.21"
