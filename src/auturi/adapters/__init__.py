"""Adapters that plug other env engines into auturi's executors."""
