"""The metrics room: step and request records and the summaries results.json reports
(``summaries``; the offload tiers' figures: ``offload``)."""
