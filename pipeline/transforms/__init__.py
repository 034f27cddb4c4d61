"""The Beam side of the steps: per-document steps (``apply``), the global steps' composites
(``dedup``, ``near_dedup``), counts as data (``counting``) and writing (``write``)."""
