"""Output: the corpus folder's layout (``layout``), the shard format (``shards``), file systems
(``fs``: local, gs://, s3:// through Beam) and their checks (``stores``)."""
