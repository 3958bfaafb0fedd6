"""The election workflow: sites vote, the server elects, sites learn the mask."""
