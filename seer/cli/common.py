"""What the CLI verbs share; the helpers themselves live in the library (the CLI imports it, never the reverse)."""

from seer.models.prepare import DEFAULT_MODEL, resolve_model
from seer.utils.io import cache_dir, read_jsonl, write_json

__all__ = ["DEFAULT_MODEL", "cache_dir", "read_jsonl", "resolve_model", "write_json"]
