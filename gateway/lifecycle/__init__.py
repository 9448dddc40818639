"""The running gateway's resources and their life: where the engine comes from and when it is
open (``engine_source``), the database part of /readyz (``dbready``), the start-up heap kept out
of garbage collections (``heap``), graceful shutdown of chat requests (``drain``).
"""
