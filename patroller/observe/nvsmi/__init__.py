"""Readers and pure parsers for what nvidia-smi prints."""
