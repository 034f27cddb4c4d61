"""Runners: option checks and the runner a ``--runner`` name gets (``options``), the Dask
translation of the Beam graph (``dask_runner``), and the fork server that starts worker
processes for the DirectRunner and Dask (``forkserver``)."""
