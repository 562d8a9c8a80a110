"""pagebench: measure what paged KV-cache management buys and what it costs."""

__version__ = "0.1.0"
