"""What the chapters share: notebook set-up and checks, figures, the running example,
and the conceptual diagrams.

``attention.course.diagrams`` draws the pictures of the ideas (X becoming Q, K and V,
scores becoming weights, masks broadcasting), computed from the package's own functions
so that a picture cannot drift from the mechanism it shows.
"""
