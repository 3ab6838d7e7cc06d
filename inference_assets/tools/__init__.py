"""Operator tools: each command module has ``main(argv)`` and runs as ``python -m inference_assets.tools.<name>``."""
