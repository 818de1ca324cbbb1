"""The extender's demand history: what claims arrived, got which card, and left (``book``), kept across
leader changes in the API (``store``), served as ``GET /history`` and exported by ``gpuslice history``."""
