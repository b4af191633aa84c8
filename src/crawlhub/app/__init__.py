"""The composition roots: what wires the components together."""
