"""The bottom layer: what every other package may use."""
