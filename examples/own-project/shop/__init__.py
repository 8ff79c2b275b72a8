"""An example application's package: its node functions live in shop.nodes."""
