"""Where fleet samples come from: a Prometheus server, or the sidecars' /metrics directly.

Every source answers `poll(now) -> FleetSample | None` (None: nothing usable this step) and
`starting_replicas() -> int`; a source that can look back also answers `history(seconds)`.
"""
