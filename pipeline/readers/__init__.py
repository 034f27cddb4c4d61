"""Input: WET/WARC files to documents (``warc``), one file at a time (``files``)."""
