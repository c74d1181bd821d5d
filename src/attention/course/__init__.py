"""What the chapters use to teach rather than to compute: their conceptual diagrams.

``attention.course.diagrams`` draws the pictures of the ideas (X becoming Q, K and V,
scores becoming weights, masks broadcasting), computed from the package's own functions
so that a picture cannot drift from the mechanism it shows.
"""

__all__: list[str] = []
