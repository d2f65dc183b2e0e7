"""File formats: each plans shards from file metadata and decodes one shard's bytes."""
