"""What several subpackages share; imports nothing above it.

Nothing here is public API.
"""
